"""etweave.runfolder and etweave.process_groups on hand-built metadata, files and group descriptions."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.errors import BadInput
from etweave.process_groups import (
    GroupDescription,
    GroupSource,
    assign_group_ids,
    describe_groups,
    local_group_ids,
)
from etweave.read.host_et import IO, PG_INIT_NAME, HostOp, HostTrace
from etweave.read.kineto import EventTable, KinetoTrace
from etweave.runfolder import (
    CommGroups,
    et_file_name,
    file_rank,
    find_comm_group,
    lone_file_rank,
    parse_comm_groups,
    read_comm_groups,
    split_rank_name,
)


def metadata(rank: object = None) -> pb.GlobalMetadata:
    md = pb.GlobalMetadata(version="0.0.4")
    if isinstance(rank, int):
        md.attr.add(name="rank", int64_val=rank)
    elif isinstance(rank, str):
        md.attr.add(name="rank", string_val=rank)
    return md


# --- a file's rank -------------------------------------------------------------------------------------------


def test_the_name_is_what_convert_run_writes_and_astra_sim_opens() -> None:
    assert et_file_name("trace", 3) == "trace.3.et"
    assert split_rank_name(Path("out") / et_file_name("a.b", 12)) == ("a.b", 12)
    assert split_rank_name("trace.3.et.gz") == ("trace", 3)
    assert split_rank_name("rank0.et") is None and split_rank_name("trace.x.et") is None
    assert split_rank_name("trace.3.json") is None


@pytest.mark.parametrize(("name", "in_metadata", "default", "rank"), [
    ("trace.2.et", 5, None, 2),  # the name wins over the metadata
    ("trace.2.et", None, 0, 2),
    ("out.et", 5, 0, 5),  # no rank in the name: the metadata
    ("out.et", None, 0, 0),  # neither: the default
])
def test_file_rank(name: str, in_metadata: int | None, default: int | None, rank: int) -> None:
    assert file_rank(metadata(in_metadata), Path(name), default) == rank


def test_file_rank_refuses() -> None:
    with pytest.raises(BadInput, match="no rank"):
        file_rank(metadata(), Path("out.et"))
    with pytest.raises(BadInput, match="GlobalMetadata attr rank is 'one', not an integer"):
        file_rank(metadata("one"), Path("trace.1.et"))  # bad even though the name has a rank


def test_a_lone_file_defaults_to_rank_0() -> None:
    assert lone_file_rank([Path("a.et")]) == 0
    assert lone_file_rank([Path("a.et"), Path("b.et")]) is None


# --- comm_group.json -----------------------------------------------------------------------------------------


def test_find_comm_group_beside_the_first_file_that_has_one(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "comm_group.json").write_text("{}")
    files = [tmp_path / "a" / "trace.0.et", tmp_path / "b" / "trace.1.et"]
    assert find_comm_group(files) == tmp_path / "b" / "comm_group.json"
    assert find_comm_group(files[:1]) is None


def test_parse_comm_groups() -> None:
    groups = parse_comm_groups({"1": [0, 1], "0": [2]}, "g.json")
    assert groups.members == {"1": [0, 1], "0": [2]}  # 0 reads; check reports it (pg-id)
    assert groups.to_json() == {"1": [0, 1], "0": [2]} and groups.ids == {} and groups.notes == ()


@pytest.mark.parametrize(("data", "problem"), [
    ([1], "expected an object"),
    ({"a": [0]}, "group id 'a' is not a decimal number"),
    ({"-1": [0]}, "group id '-1' is not a decimal number"),
    ({"\u0663": [0]}, "is not a decimal number"),  # a decimal digit ASTRA-sim's stoi does not read
    ({"1": "all"}, "group 1: expected a list of integer ranks"),
    ({"1": [0, True]}, "group 1: expected a list of integer ranks"),
])
def test_parse_comm_groups_refuses(data: object, problem: str) -> None:
    with pytest.raises(BadInput, match=problem) as exc:
        parse_comm_groups(data, "g.json")
    assert exc.value.where == "g.json"


def test_read_comm_groups(tmp_path: Path) -> None:
    path = tmp_path / "comm_group.json"
    path.write_bytes(orjson.dumps({"2": [1, 3]}))
    assert read_comm_groups(path) == CommGroups({"2": [1, 3]})
    path.write_bytes(b"{")
    with pytest.raises(BadInput, match="not JSON"):
        read_comm_groups(path)


# --- process groups ------------------------------------------------------------------------------------------


def host_with_groups(groups: list[dict[str, object]]) -> HostTrace:
    init = HostOp(id=3, name=PG_INIT_NAME, parent=1, et_tid=1, rf_id=0, seq_id=-1, fw_parent=0, fw_tid=0, scope=0,
                  op_schema="", inputs=IO([orjson.dumps(groups).decode()], [[]], ["String"]),
                  outputs=IO([], [], []))
    return HostTrace(path="host.json", schema="1.0.3-chakra.0.0.4", pid=1, ops=[init])


def kineto_with(distributed: dict[str, object]) -> KinetoTrace:
    return KinetoTrace(path="k.json", events=EventTable([]), distributed=dict(distributed))


def test_describe_groups_reads_each_source_once() -> None:
    host = host_with_groups([{"pg_name": "0", "ranks": [], "group_size": 4},
                             {"pg_name": "9f", "ranks": [3, 1], "group_size": 2}, "not a group"])
    kineto = kineto_with({"world_size": 4, "pg_config": [{"pg_name": "9f", "ranks": "all", "pg_size": 4},
                                                         {"ranks": [0, 2]}]})
    assert describe_groups(host, kineto) == [
        GroupDescription("0", (), 4, GroupSource.HOST),
        GroupDescription("9f", (1, 3), 2, GroupSource.HOST),
        GroupDescription("9f", None, 4, GroupSource.PG_CONFIG),  # "all" unread, as before issue 14 (the report)
        GroupDescription(None, (0, 2), None, GroupSource.PG_CONFIG),
    ]


def test_local_group_ids() -> None:
    host = host_with_groups([{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "9f", "ranks": [1, 3]},
                             {"pg_name": "2", "ranks": [0, 2]}, {"pg_name": "all", "ranks": "all"}])
    kineto = kineto_with({"world_size": 4})
    # the list of every rank is the world group; "2" keeps its name, "9f" gets the smallest free id
    assert local_group_ids(host, kineto) == {"0": "", "all": "", "2": "2", "9f": "1"}
    # without host groups: Kineto's pg_config; a group with no name is named by its position
    kineto = kineto_with({"pg_config": [{"pg_name": "a", "ranks": [0]}, {"ranks": [1]}]})
    assert local_group_ids(None, kineto) == {"1": "1", "a": "2"}  # "1" is an id already: it keeps it
    assert local_group_ids(None, None) == {}


def test_assign_group_ids() -> None:
    assert assign_group_ids(["x", "3", "y", "0", "03"]) == {"3": "3", "x": "1", "y": "2", "0": "4", "03": "5"}
    assert assign_group_ids([]) == {}
