"""build nodes: hand-built items and edges into Chakra nodes, with the attrs each kind of item gets."""

from __future__ import annotations

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs
from etweave.deps import Dependencies
from etweave.deps.evidence import Evidence
from etweave.model import HOST_OP, KERNEL, PROCESS_ROOT, RUNTIME, Comm, Edge, Graph, Ids, Item, OpRecord
from etweave.nodes import Rounded, build_nodes, duration, encode_nodes
from etweave.read.host_et import IO, PG_INIT_NAME
from etweave.roofline import Roofline


def _record(inputs: IO, schema: str = "") -> OpRecord:
    return OpRecord(et_tid=3, et_parent=1, rf_id=11, seq_id=-1, op_schema=schema, inputs=inputs,
                    outputs=IO([], [], []), input_tensors=(), output_tensors=())


def _graph() -> Graph:
    items = [
        Item(id=1, kind=PROCESS_ROOT, name="[process]", host=_record(IO([], [], [])), start=5, seg_end=900),
        Item(id=2, kind=HOST_OP, name="aten::add", start=100.4, dur=20, excl=15.2, seg_end=110.6, measured=True,
             tid=7, host=_record(IO([[1, 2, 0, 4, 4, "cuda:0"]], [[4]], ["Tensor(float)"]), "aten::add(Tensor)")),
        Item(id=3, kind=RUNTIME, name="cudaLaunchKernel", start=105, dur=5, seg_end=110, measured=True, tid=7,
             correlation=42, enclosing=2),
        Item(id=4, kind=KERNEL, name="add_kernel", start=130, dur=8, seg_end=138, measured=True, device=0, stream=7,
             launcher=3),
        Item(id=5, kind=KERNEL, name="ncclDevKernel_AllReduce", start=140, dur=30.6, seg_end=170.6, measured=True,
             device=0, stream=20, comm=Comm(pb.COMM_COLL_NODE, "allreduce", pb.ALL_REDUCE, 1024, "1", 4)),
        Item(id=6, kind=HOST_OP, name=PG_INIT_NAME, host=_record(IO(['[{"pg_name": "0"}]'], [], ["String"])),
             tid=7),
    ]
    return Graph(items=items, by_id={it.id: it for it in items}, ids=Ids(7))


ROOFLINE = Roofline({4: (64, 48)}, gpu_time_us=8, gpu_time_covered_us=8, ops={"elementwise": 1})


def _nodes() -> dict[int, pb.Node]:
    deps = Dependencies(preds={4: (Edge(3, 4, Evidence.LAUNCH),), 3: (Edge(2, 3, Evidence.THREAD_ORDER),)})
    return {n.id: n for n in build_nodes(_graph(), deps, ROOFLINE)}


def test_host_op_node() -> None:
    node = _nodes()[2]
    assert (node.type, node.start_time_micros, node.duration_micros) == (pb.COMP_NODE, 100, 11)
    assert node.inputs.values == '[[1,2,0,4,4,"cuda:0"]]' and node.inputs.types == '["Tensor(float)"]'
    attrs = node_attrs(node)
    assert attrs["et_tid"] == 3 and attrs["et_parent"] == 1 and attrs["rf_id"] == 11 and attrs["linked"] is True
    assert attrs["op_schema"] == "aten::add(Tensor)" and attrs["exclusive_micros"] == 15 and attrs["tid"] == 7
    assert (attrs["num_ops"], attrs["tensor_size"]) == (0, 0)  # not a GPU event: no roofline work


def test_runtime_and_gpu_nodes() -> None:
    nodes = _nodes()
    runtime, kernel = node_attrs(nodes[3]), node_attrs(nodes[4])
    assert runtime["correlation"] == 42 and runtime["is_cpu_op"] is True and "et_tid" not in runtime
    assert list(nodes[4].data_deps) == [3] and kernel["dep_evidence"] == ["launch"]
    assert kernel["is_cpu_op"] is False and (kernel["device"], kernel["stream"]) == (0, 7)
    assert (kernel["num_ops"], kernel["tensor_size"]) == (64, 48) and "correlation" not in kernel


def test_comm_node() -> None:
    node = _nodes()[5]
    attrs = node_attrs(node)
    assert node.type == pb.COMM_COLL_NODE and "num_ops" not in attrs
    assert (attrs["comm_type"], attrs["comm_size"], attrs["pg_name"], attrs["comm_seq"]) == (pb.ALL_REDUCE, 1024,
                                                                                               "1", 4)
    assert attrs["measured_duration_micros"] == 31 and "comm_src" not in attrs


def test_markers_take_no_time() -> None:
    nodes = _nodes()
    assert nodes[1].duration_micros == 0 and node_attrs(nodes[1])["kind"] == PROCESS_ROOT
    pg_init = nodes[6]
    # ASTRA-sim would read the inputs as group names: left empty, the host ET's list kept in an attr
    assert pg_init.inputs.values == "" and node_attrs(pg_init)["pg_config"] == '["[{\\"pg_name\\": \\"0\\"}]"]'
    assert node_attrs(pg_init)["kind"] == "process_group_init" and duration(_graph().by_id[6]) == 0


def test_encoding_is_protobufs() -> None:
    """The hand encoder writes what protobuf writes for the same message, negative and ten-byte varints
    included (a send with a negative tag, an id past 2**32, a thread id below 0, an empty name)."""
    g = _graph()
    g.items += [
        Item(id=2**40, kind=HOST_OP, name="", start=2**35 + 0.4, seg_end=2**35 + 9, measured=True, tid=-5,
             host=_record(IO([], [], []))),
        Item(id=8, kind=KERNEL, name="ncclSend", start=1, dur=3, seg_end=4, measured=True, device=1, stream=2,
             comm=Comm(pb.COMM_SEND_NODE, "send", pb.ALL_REDUCE, 8, "", None, 0, 1, -(2**31))),
    ]
    deps = Dependencies(preds={8: (Edge(2**40, 8, Evidence.LAUNCH), Edge(4, 8, Evidence.THREAD_ORDER))})
    for data in encode_nodes(g, deps, ROOFLINE):
        assert pb.Node.FromString(data).SerializeToString(deterministic=True) == data


def test_out_of_range_values_refused_as_protobuf_does() -> None:
    g = _graph()
    g.items = [Item(id=9, kind=KERNEL, name="ncclSend", device=1, stream=2,
                    comm=Comm(pb.COMM_SEND_NODE, "send", pb.ALL_REDUCE, 8, "", None, 0, 1, 2**31))]
    with pytest.raises(ValueError, match="out of range for int32"):
        list(encode_nodes(g, Dependencies(preds={})))


def test_varints_as_protobuf_writes_them() -> None:
    """Every length of varint, at and around each 7-bit boundary, against protobuf's own encoding."""
    from etweave.nodes import _varint
    for bits in range(65):
        for value in (2**bits - 1, 2**bits, 2**bits + 1):
            if 0 <= value < 2**64:
                expected = pb.Node(start_time_micros=value).SerializeToString()[1:] if value else b"\x00"
                assert _varint(value) == expected, value


def test_every_two_byte_varint_as_protobuf_writes_it() -> None:
    """The 14-bit tables, entry by entry: every value below 2**14, and each as the low 14 bits of a longer one."""
    from etweave.nodes import _varint
    for low in range(0x4000):
        for value in (low, low | 1 << 14):
            expected = pb.Node(start_time_micros=value).SerializeToString()[1:] if value else b"\x00"
            assert _varint(value) == expected, value


def test_values_at_the_encoders_split_points_as_protobuf_writes_them() -> None:
    """Ids, deps, times and int attrs on each side of the encoder's fast paths (one and two 14-bit table entries,
    three-byte values, the cached high bits of start times), decoded back to what they were built from."""
    edges = [0x3FFF, 0x4000, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**40]
    items = [Item(id=v, kind=RUNTIME, name="cudaLaunchKernel", start=v * 977.0, seg_end=v * 977.0 + (v % 300),
                  measured=True, tid=7, correlation=v, part_of=v) for v in edges]
    preds = {v: (Edge(edges[i - 1], v, Evidence.THREAD_ORDER),) for i, v in enumerate(edges) if i}
    preds[edges[-1]] = tuple(Edge(v, edges[-1], Evidence.THREAD_ORDER) for v in edges[:-1])  # many deps
    g = Graph(items=items, by_id={it.id: it for it in items}, ids=Ids(2**41))
    encoded = encode_nodes(g, Dependencies(preds=preds))
    for data, it, data_deps in zip(list(encoded), items, encoded.data_deps, strict=True):
        node = pb.Node.FromString(data)
        assert node.SerializeToString(deterministic=True) == data
        assert (node.id, tuple(node.data_deps), node.start_time_micros) == (it.id, data_deps, round(it.start))
        assert node.duration_micros == round(it.seg_end) - round(it.start)
        assert node_attrs(node)["correlation"] == it.id == node_attrs(node)["part_of"]


def test_given_times_are_the_ones_written_and_encoding_twice_is_refused() -> None:
    """The times the audit rounded (`Rounded`) are what the nodes carry; a list of another length, or a second pass
    over the same nodes (what the self-check reads is kept as they go), is refused."""
    g = _graph()
    deps = Dependencies(preds={3: (Edge(2, 3, Evidence.THREAD_ORDER),)})
    times = Rounded.of(g.items)
    times.start[2], times.length[2] = 1000, 7  # (the runtime call's, as a caller might have rounded them)
    encoded = encode_nodes(g, deps, ROOFLINE, times)
    node = pb.Node.FromString(list(encoded)[2])
    assert (node.start_time_micros, node.duration_micros) == (1000, 7)
    assert encoded.data_deps == [(), (), (2,), (), (), ()]
    with pytest.raises(RuntimeError, match="encoded once"):
        list(encoded)
    with pytest.raises(ValueError, match="rounded times for 6 items"):
        list(encode_nodes(g, deps, ROOFLINE, Rounded(times.start[:5], times.length[:5])))
