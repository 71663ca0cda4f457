"""`check` and `simulate` read one run folder by one rule (etweave.runfolder): a file's rank is its name
`<prefix>.<rank>.et` (what ASTRA-sim opens) even where its GlobalMetadata says otherwise, and a comm_group.json
key that is not decimal is refused by both, with one message."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import write_et
from etweave.cli import main
from etweave.simulate.load import load_rank

GPU = (("is_cpu_op", "bool_val", False), ("device", "int64_val", 0), ("stream", "int64_val", 7))


def node(nid: int, ntype: int, deps: list[int], duration: int, start: int,
         *attrs: tuple[str, str, object]) -> pb.Node:
    nd = pb.Node(id=nid, name=f"n{nid}", type=ntype, data_deps=deps, duration_micros=duration,  # type: ignore[arg-type]
                 start_time_micros=start)
    for name, kind, value in attrs:
        setattr(nd.attr.add(name=name), kind, value)
    return nd


def rank_nodes(send: bool) -> list[pb.Node]:
    """A kernel, then rank 0 sends 64 bytes to rank 1 (tag 7) or rank 1 receives them, then a collective of
    group 1."""
    comp = node(1, pb.COMP_NODE, [], 10, 100, *GPU, ("num_ops", "int64_val", 0), ("tensor_size", "uint64_val", 0))
    p2p = node(2, pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, [1], 5, 110, *GPU, ("comm_src", "int32_val", 0),
               ("comm_dst", "int32_val", 1), ("comm_tag", "int32_val", 7), ("comm_size", "int64_val", 64))
    coll = node(3, pb.COMM_COLL_NODE, [2], 5, 120, *GPU, ("comm_type", "int64_val", pb.ALL_REDUCE),
                ("comm_size", "int64_val", 64), ("pg_name", "string_val", "1"))
    return [comp, p2p, coll]


def swapped_folder(folder: Path, groups: dict[str, list[int]]) -> list[Path]:
    """trace.0.et says rank 1 in its metadata and trace.1.et says rank 0: the names are right, the metadata is
    not (the sender's comm_src is 0, the file named rank 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for named, in_metadata in ((0, 1), (1, 0)):
        metadata = pb.GlobalMetadata(version="0.0.4")
        metadata.attr.add(name="rank", int64_val=in_metadata)
        path = folder / f"trace.{named}.et"
        write_et(path, metadata, rank_nodes(send=named == 0))
        files.append(path)
    (folder / "comm_group.json").write_bytes(orjson.dumps(groups))
    return files


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_and_simulate_take_a_files_rank_from_its_name(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    files = swapped_folder(tmp_path, {"1": [0, 1]})
    assert [load_rank(f).rank for f in files] == [0, 1]
    # check: by the metadata the send (comm_src 0) would sit in rank 1's file, a p2p-rank violation
    code, out, _ = run(capsys, "check", "--json", str(tmp_path))
    report = orjson.loads(out)
    assert code == 0 and report["ok"] and report["counts"] == {}, out
    # not silent: each file whose name and metadata disagree is a warning that says which rank it was read as
    renamed = {Path(w["where"]).name: w["message"] for w in report["warnings"] if w["rule"] == "rank-name"}
    assert sorted(renamed) == ["trace.0.et", "trace.1.et"]
    assert "metadata rank 1: read as rank 0" in renamed["trace.0.et"]
    assert "metadata rank 0: read as rank 1" in renamed["trace.1.et"]
    code, out, err = run(capsys, "simulate", "--json", str(tmp_path))
    assert code == 0, err
    assert [(r["rank"], Path(r["file"]).name) for r in orjson.loads(out)["per_rank"]] == [
        (0, "trace.0.et"), (1, "trace.1.et")]


@pytest.mark.parametrize(("key", "problem"), [
    ("all", "group id 'all' is not a decimal number"),
    ("٣", "group id '٣' is not a decimal number"),  # a decimal digit, but not one ASTRA-sim's stoi reads
])
def test_check_and_simulate_refuse_a_key_that_is_not_decimal_alike(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, problem: str) -> None:
    swapped_folder(tmp_path, {key: [0, 1]})
    errors = []
    for command in ("check", "simulate"):
        code, out, err = run(capsys, command, str(tmp_path))
        assert (code, out) == (2, ""), command
        errors.append(err)
    assert errors[0] == errors[1]
    assert errors[0].startswith(f"etweave: error: {tmp_path / 'comm_group.json'}: {problem}")


def test_id_0_reads_and_check_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An id of 0 is a decimal key: both read it; check says ASTRA-sim asserts on it, simulate replays it."""
    swapped_folder(tmp_path, {"0": [0, 1], "1": [0, 1]})
    code, out, _ = run(capsys, "check", str(tmp_path))
    assert code == 3 and "comm group map: pg-id: group id '0' is not a decimal id >= 1" in out
    code, _, err = run(capsys, "simulate", str(tmp_path))
    assert code == 0, err


def write_plain(path: Path, rank: pb.AttributeProto | None, send: bool) -> None:
    metadata = pb.GlobalMetadata(version="0.0.4")
    if rank is not None:
        metadata.attr.append(rank)
    write_et(path, metadata, rank_nodes(send))


@pytest.mark.parametrize("case", ["metadata rank not an integer", "group not a list", "no rank anywhere"])
def test_check_and_simulate_refuse_a_bad_folder_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      case: str) -> None:
    """docs/ERRORS.md's rows on run folders: the same exit 2 and the same line from both commands."""
    swapped_folder(tmp_path, {"1": [0, 1]})
    if case == "metadata rank not an integer":
        write_plain(tmp_path / "trace.0.et", pb.AttributeProto(name="rank", string_val="zero"), send=True)
        problem = f"{tmp_path / 'trace.0.et'}: GlobalMetadata attr rank is 'zero', not an integer"
    elif case == "group not a list":
        (tmp_path / "comm_group.json").write_bytes(b'{"1": "all"}')
        problem = f"{tmp_path / 'comm_group.json'}: group 1: expected a list of integer ranks"
    else:
        for named in (0, 1):
            (tmp_path / f"trace.{named}.et").unlink()
            write_plain(tmp_path / f"part{named}.et", None, send=named == 0)
        problem = f"{tmp_path / 'part0.et'}: no rank: neither a name like <prefix>.<rank>.et nor a GlobalMetadata"
    for command in ("check", "simulate"):
        code, out, err = run(capsys, command, str(tmp_path))
        assert (code, out) == (2, ""), command
        assert err.startswith(f"etweave: error: {problem}"), (command, err)
