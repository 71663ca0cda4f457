"""etweave.run.cross_rank and the per-rank result of etweave.run.workers on hand-built converted ranks."""

from __future__ import annotations

import pickle

import msgspec
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs, serialize
from etweave.errors import BadInput, CheckFailed
from etweave.process_groups import GroupDescription, GroupSource
from etweave.run.cross_rank import assemble_run, build_comm_group
from etweave.run.workers import ConvertedRank, RankFailure
from etweave.runfolder import CommGroups

WORLD = GroupDescription("0", (), 4, GroupSource.HOST)  # ranks 2 and 3 are not converted
PAIR = GroupDescription("c0ffee", (0, 1), 2, GroupSource.HOST)


def root() -> pb.Node:
    node = pb.Node(id=1, name="root", type=pb.COMP_NODE)
    node.attr.extend([pb.AttributeProto(name="kind", string_val="process_root"),
                      pb.AttributeProto(name="num_ops", int64_val=0),
                      pb.AttributeProto(name="tensor_size", uint64_val=0)])
    return node


def allreduce(nid: int, pg: str, start: int, measured: int, size: int = 64) -> pb.Node:
    node = pb.Node(id=nid, name="nccl:all_reduce", type=pb.COMM_COLL_NODE, data_deps=[1], start_time_micros=start,
                   duration_micros=measured)
    for name, kind, value in (("is_cpu_op", "bool_val", False), ("device", "int64_val", 0),
                              ("stream", "int64_val", 7), ("collective_name", "string_val", "allreduce"),
                              ("comm_type", "int64_val", pb.ALL_REDUCE), ("comm_size", "int64_val", size),
                              ("pg_name", "string_val", pg), ("measured_duration_micros", "int64_val", measured)):
        setattr(node.attr.add(name=name), kind, value)
    return node


def converted(rank: int, local_pair_id: str, start: int, measured: int, size: int = 64,
              trace_rank: int | None = None) -> ConvertedRank:
    """A rank with one all-reduce in the subgroup c0ffee, which its converter numbered `local_pair_id`."""
    stream = serialize(pb.GlobalMetadata(version="0.0.4"), [root(), allreduce(2, local_pair_id, start, measured, size)])
    return ConvertedRank(rank=rank, et=stream, report={"nodes": 2}, local_groups={"0": "", "c0ffee": local_pair_id},
                         groups=(WORLD, PAIR), world_size=4, trace_rank=rank if trace_rank is None else trace_rank)


def test_a_converted_rank_crosses_process_boundaries() -> None:
    out = converted(0, "1", 100, 50)
    assert pickle.loads(pickle.dumps(out)) == out
    failure = RankFailure(3, "k.json", "not JSON")
    assert pickle.loads(pickle.dumps(failure)) == failure
    assert isinstance(failure.error(), BadInput) and str(failure.error()) == "k.json: not JSON"
    assert isinstance(RankFailure(3, "", "not of one run", mismatch=True).error(), CheckFailed)


def test_build_comm_group() -> None:
    other = GroupDescription("c0ffee", (0, 2), 2, GroupSource.EVENT_ARGS)  # disagrees: the first list is kept
    outputs = [converted(0, "1", 0, 1), converted(1, "1", 0, 1)]
    outputs[1] = ConvertedRank(1, b"", {}, {}, (WORLD, other, GroupDescription(None, None, None, GroupSource.HOST)),
                               2, 1)
    groups = build_comm_group(outputs, 4)
    assert groups == CommGroups({"1": [0, 1]}, {"0": "", "c0ffee": "1"}, (
        "process group 'c0ffee': rank 1 (kineto_args) lists ranks 0,2, another source 0-1; kept the first",))
    assert groups.to_json() == {"1": [0, 1]}
    assert build_comm_group(outputs, 2).ids == {"0": "", "c0ffee": ""}  # ranks 0-1 of 2 are the world group


def test_assemble_run_gives_one_id_and_cuts_the_wait() -> None:
    # the converters numbered the pair 2 on rank 0 and 1 on rank 1; rank 1 came 30 µs late
    outputs = [converted(0, "2", start=100, measured=50), converted(1, "1", start=130, measured=22, trace_rank=5)]
    result = assemble_run(outputs)
    assert all(out.et == b"" for out in outputs)  # the streams were taken, not copied
    assert result.consistent and result.comm_group.members == {"1": [0, 1]}
    report = result.report
    assert report["pg_name_rewritten"] == 1 and report["comm_group"] == {"1": [0, 1]}
    assert report["rank_start_offsets_micros"] == {"0": 0, "1": 30}
    assert report["ranks"]["1"]["nodes"] == 3  # the offset node is counted
    # (the world group issues no collective here, so its absent members 2 and 3 are not noted)
    assert report["notes"] == ["rank 1: its Kineto trace says rank 5; the folder/file name was used"]
    assert report["durations"]["adjusted"] == 1
    durations = {}
    for rank, (_, nodes) in result.ranks.items():
        coll = next(n for n in nodes if n.type == pb.COMM_COLL_NODE)
        durations[rank] = (node_attrs(coll)["pg_name"], coll.duration_micros)
    assert durations == {0: ("1", 20), 1: ("1", 22)}  # ends 150 and 152, latest start 130


def test_assemble_run_reports_divergence() -> None:
    result = assemble_run([converted(0, "1", 100, 10, size=64), converted(1, "1", 100, 10, size=128)])
    assert not result.consistent
    assert result.messages and "group 1: rank" in result.messages[0]


def test_assemble_run_refuses_a_rank_twice() -> None:
    with pytest.raises(BadInput, match="two inputs convert to the same rank"):
        assemble_run([converted(0, "1", 100, 10), converted(0, "1", 100, 10)])


def _with_extra(out: ConvertedRank, extra: list[pb.Node], comm_edit: str | None = None) -> ConvertedRank:
    """`out` with more nodes after its own, its all-reduce's attr `comm_edit` removed when given."""
    from etweave.chakra.io import parse

    assert isinstance(out.et, bytes)
    metadata, nodes = parse(out.et)
    if comm_edit is not None:
        kept = [a for a in nodes[1].attr if a.name != comm_edit]
        del nodes[1].attr[:]
        nodes[1].attr.extend(kept)
    return msgspec.structs.replace(out, et=serialize(metadata, [*nodes, *extra]))


def test_the_cross_rank_pass_checks_what_it_changed_in_full_and_every_graph() -> None:
    """Each rank's nodes were checked when converted: the cross-rank pass checks again in full the nodes it
    changes (here the all-reduce, whose duration it cuts). A rank that comes without its converter's summary (as
    these hand-built ones) has its whole graph checked here: a dangling dep in a node left alone is found."""
    no_size = [_with_extra(converted(r, "1", 100 + 30 * r, 50), [], comm_edit="comm_size") for r in (0, 1)]
    with pytest.raises(CheckFailed, match="comm-missing-attr"):
        assemble_run(no_size)
    dangling = pb.Node(id=3, name="op", type=pb.COMP_NODE, data_deps=[99])
    with pytest.raises(CheckFailed, match="dangling-data-dep"):
        assemble_run([_with_extra(converted(0, "1", 100, 50), [dangling]), converted(1, "1", 130, 22)])
