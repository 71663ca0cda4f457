"""collectives: which items are communication, with type, size, group and peer, on hand-built graphs."""

from __future__ import annotations

from etweave.chakra import et_def_pb2 as pb
from etweave.collectives import COMM_MADE_OF, RECV, SEND, classify, find_collectives
from etweave.model import HOST_OP, KERNEL, RUNTIME, Comm, CommArgs, Graph, Ids, Item, KinetoArgs, OpRecord, TensorRef
from etweave.read.host_et import IO


def _record(tensors: tuple[TensorRef, ...] = (), call: bool = False, comm: CommArgs | None = None) -> OpRecord:
    empty = IO([], [], [])
    return OpRecord(et_tid=1, et_parent=0, rf_id=0, seq_id=-1, op_schema="", inputs=empty, outputs=empty,
                    input_tensors=tensors, output_tensors=(), collective_call=call, comm=comm)


def _op(op_id: int, name: str, start: float, host: OpRecord, tid: int = 1, enclosing: int | None = None) -> Item:
    return Item(id=op_id, kind=HOST_OP, name=name, start=start, dur=50, measured=True, tid=tid, host=host,
                enclosing=enclosing)


def _launch(op_id: int, start: float, enclosing: int) -> Item:
    return Item(id=op_id, kind=RUNTIME, name="cudaLaunchKernel", start=start, dur=2, measured=True, tid=1,
                enclosing=enclosing)


def _kernel(op_id: int, name: str, launcher: int | None, kineto: KinetoArgs | None = None) -> Item:
    return Item(id=op_id, kind=KERNEL, name=name, start=200, dur=30, measured=True, device=0, stream=20,
                launcher=launcher, kineto=kineto)


def _graph(*items: Item, rank: int = 0) -> Graph:
    return Graph(items=list(items), by_id={it.id: it for it in items}, rank=rank,
                 ids=Ids(max((it.id for it in items), default=0) + 1))


def test_classify_names() -> None:
    assert classify("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == pb.ALL_REDUCE
    assert classify("c10d::_reduce_scatter_base_") == pb.REDUCE_SCATTER
    assert classify("gloo:all_reduce") == pb.ALL_REDUCE
    assert classify("c10d::send") == SEND and classify("c10d::recv_") == RECV
    assert classify("ncclDevKernel_SendRecv") is None  # all_to_all and p2p alike: ambiguous by itself
    assert classify("aten::add") is None


def test_nccl_kernel_takes_type_and_size_from_its_call() -> None:
    call = _op(1, "c10d::allreduce_", 100, _record(((0, 5, 6, 256, 4),), call=True))
    kernel = _kernel(3, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2, KinetoArgs(seq=4, pg_name="pg"))
    stats = find_collectives(_graph(call, _launch(2, 110, 1), kernel), {"pg": "1"})
    assert kernel.comm == Comm(pb.COMM_COLL_NODE, "allreduce", pb.ALL_REDUCE, 1024, "1", 4, type_source="host")
    assert call.comm is None  # the call stays a CPU op: the kernel does the work
    assert (stats.calls, stats.comm_nodes, stats.unmatched_calls) == (1, 1, [])


def test_kineto_args_when_no_call() -> None:
    kernel = _kernel(4, "ncclDevKernel_Generic", None, KinetoArgs(collective_name="allgather", in_nelems=10,
                                                                   dtype="Float", collective_args=True))
    stats = find_collectives(_graph(kernel), {})
    assert kernel.comm == Comm(pb.COMM_COLL_NODE, "allgather", pb.ALL_GATHER, 40, "", None,
                               type_source="kineto_args")
    assert stats.type_fallbacks == {} and stats.size_unknown == 0


def test_unknown_type_and_size_are_counted() -> None:
    kernel = _kernel(4, "ncclDevKernel_Generic", None)
    stats = find_collectives(_graph(kernel), {})
    assert kernel.comm is not None and kernel.comm.comm_type == pb.ALL_REDUCE and kernel.comm.size == 0
    assert stats.type_fallbacks == {"default": 1} and stats.size_unknown == 1


def test_send_names_its_peer_and_tag() -> None:
    call = _op(1, "c10d::send", 100, _record(((0, 7, 8, 4, 4),), call=True, comm=CommArgs(peer=1, tag=9)))
    kernel = _kernel(3, "ncclDevKernel_SendRecv", 2)
    find_collectives(_graph(call, _launch(2, 110, 1), kernel, rank=2), {})
    assert kernel.comm == Comm(pb.COMM_SEND_NODE, "send", 0, 16, "", None, src=2, dst=1, tag=9, type_source="host")


def test_gloo_op_pairs_with_the_call_of_its_tensor() -> None:
    first = _op(1, "c10d::allreduce_", 100, _record(((0, 5, 6, 8, 4),), call=True))
    second = _op(2, "c10d::broadcast_", 160, _record(((0, 9, 9, 2, 4),), call=True))
    # the gloo worker (another thread) works on the second call's tensor: that is its call, the first is unmatched
    gloo = _op(3, "gloo:broadcast", 170, _record(((0, 9, 9, 2, 4),)), tid=2)
    stats = find_collectives(_graph(first, second, gloo), {})
    assert gloo.comm == Comm(pb.COMM_COLL_NODE, "broadcast", pb.BROADCAST, 8, "", None, type_source="host")
    assert stats.unmatched_calls == [first] and stats.calls == 2


def test_comm_nodes_are_made_only_of_the_kinds_the_audit_looks_among() -> None:
    # the audit looks for comm nodes among COMM_MADE_OF's kinds only: a comm node of any other kind would be missed
    call = _op(1, "c10d::allreduce_", 100, _record(((0, 5, 6, 8, 4),), call=True))
    gloo = _op(3, "gloo:allreduce", 170, _record(((0, 5, 6, 8, 4),)), tid=2)
    kernel = _kernel(5, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 4)
    g = _graph(call, _launch(2, 110, 1), gloo, _launch(4, 120, 1), kernel)
    find_collectives(g, {})
    made = [it for it in g.items if it.comm is not None]
    assert {it.id for it in made} == {3, 5} and all(it.kind in COMM_MADE_OF for it in made)
