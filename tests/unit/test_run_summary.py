"""etweave.run.summary: what the cross-rank work reads of a rank's stream, and the splice that writes its final
stream without parsing the nodes it leaves alone."""

from __future__ import annotations

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import parse, serialize
from etweave.chakra.reduced import node_class
from etweave.run.summary import PART_OF, message, node_spans, offset_targets, splice, summarize, summary_of


def node(nid: int, kind: str, deps: tuple[int, ...] = (), ntype: int = pb.COMP_NODE, start: int = 0,
         part_of: int | None = None) -> pb.Node:
    n = pb.Node(id=nid, name=f"n{nid}", type=ntype, data_deps=deps, start_time_micros=start, duration_micros=5)
    n.attr.add(name="kind", string_val=kind)
    if part_of is not None:
        n.attr.add(name=PART_OF, int64_val=part_of)
    return n


def stream() -> tuple[bytes, list[pb.Node]]:
    nodes = [
        node(1, "process_root"),
        node(2, "thread_root", (1,)),
        node(3, "cpu_op", (2,), start=120),
        node(4, "cpu_op", (), start=110),  # a source: follows nothing
        node(5, "collective", (3,), ntype=pb.COMM_COLL_NODE, start=130),
        node(6, "cpu_op", (5,), start=140, part_of=5),  # a later period of the collective
        node(7, "cpu_op", (3,), start=150, part_of=3),  # part_of a node that is no collective: not listed
        node(9, "cpu_op", (1, 4), start=160),  # follows the root and a source: not a target
    ]
    return serialize(pb.GlobalMetadata(version="0.0.4"), nodes), nodes


def test_summary_names_what_the_cross_rank_work_changes() -> None:
    data, nodes = stream()
    s = summary_of(data)
    assert (s.nodes, s.next_id, s.first_start) == (8, 10, 110)
    assert s.comm == (5,) and s.parts == (6,) and s.roots == (1,)
    assert s.offset_targets == (2, 4)  # the thread root, and the source with no predecessor
    assert sorted(s.spans) == [2, 4, 5, 6]
    for nid, span in s.spans.items():
        assert pb.Node.FromString(message(data, span)) == next(n for n in nodes if n.id == nid)


def test_offset_targets_of_markers_and_ctrl_deps() -> None:
    old_root = pb.Node(id=1, name="root", type=pb.METADATA_NODE)  # older outputs: roots as METADATA_NODEs
    old_root.attr.add(name="kind", string_val="process_root")
    ctrl = node(2, "cpu_op")
    ctrl.ctrl_deps.append(1)  # a ctrl dep: not a source
    roots, targets = offset_targets([old_root, ctrl, node(3, "thread_root", (1,)), node(4, "cpu_op", (1,))])
    assert roots == {1} and targets == [3, 4]


@pytest.mark.parametrize("grow", [0, 200])  # the edited node's length prefix from one byte to two
def test_splice_is_the_stream_of_the_edited_nodes(grow: int) -> None:
    data, nodes = stream()
    s = summary_of(data)
    edited = pb.Node.FromString(message(data, s.spans[5]))
    edited.duration_micros = 1
    edited.attr.add(name="note", string_val="x" * grow)
    source = pb.Node.FromString(message(data, s.spans[4]))
    source.data_deps.append(10)
    extra = node(10, "delay", (1,))
    out = splice(data, s.spans, {5: edited.SerializeToString(deterministic=True),
                                 4: source.SerializeToString(deterministic=True)},
                 extra.SerializeToString(deterministic=True))
    by_id = {5: edited, 4: source}
    expected = serialize(pb.GlobalMetadata(version="0.0.4"), [by_id.get(n.id, n) for n in nodes] + [extra])
    assert out == expected
    assert [n.id for n in parse(out)[1]] == [1, 2, 3, 4, 5, 6, 7, 9, 10]


def test_broken_framing_is_bad_input() -> None:
    from etweave.errors import BadInput

    data, _ = stream()
    with pytest.raises(BadInput, match="truncated"):
        node_spans(data[:-3])
    with pytest.raises(BadInput, match="empty"):
        node_spans(b"")


def test_summary_of_reads_what_a_whole_parse_reads() -> None:
    """summary_of parses skeletons (and the attrs of a few nodes): the summary of the whole nodes, whatever the
    length prefixes' widths (a node of over 127 and of over 16383 bytes)."""
    data, nodes = stream()
    big = node(10, "cpu_op", (9,), start=170)
    big.inputs.values = "x" * 200
    huge = node(11, "cpu_op", (10,), start=180)
    huge.inputs.values = "y" * 20000
    data = serialize(pb.GlobalMetadata(version="0.0.4"), [*nodes, big, huge])
    _metadata, whole = parse(data)
    assert summary_of(data) == summarize(data, whole, node_spans(data)[1])


def test_reduced_node_class_reads_its_fields_as_chakra_writes_them() -> None:
    n = node(7, "cpu_op", (3, 4), ntype=pb.COMM_COLL_NODE, start=2**40, part_of=3)
    n.ctrl_deps.append(2)
    skeleton = node_class("TestSkeleton", ("id", "type", "data_deps", "ctrl_deps", "start_time_micros"))
    got = skeleton.FromString(n.SerializeToString())
    assert (got.id, got.type, list(got.data_deps), list(got.ctrl_deps), got.start_time_micros) == \
        (7, pb.COMM_COLL_NODE, [3, 4], [2], 2**40)
    as_bytes = node_class("TestBytes", ("name", "attr"), as_bytes=frozenset({"name", "attr"}))
    raw = as_bytes.FromString(n.SerializeToString())
    assert raw.name == b"n7"
    assert [pb.AttributeProto.FromString(a) for a in raw.attr] == list(n.attr)
