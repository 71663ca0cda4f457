"""roofline: FLOPs and bytes of hand-built ops, spread over the GPU events they launched."""

from __future__ import annotations

from etweave.model import HOST_OP, KERNEL, MEMCPY, RUNTIME, Comm, Graph, Ids, Item, OpRecord
from etweave.read.host_et import IO
from etweave.roofline import assign, op_work, spread


def _record(inputs: IO, outputs: IO) -> OpRecord:
    return OpRecord(et_tid=1, et_parent=0, rf_id=0, seq_id=-1, op_schema="", inputs=inputs, outputs=outputs,
                    input_tensors=(), output_tensors=())


# x (8x16) @ W (16x4) -> y (8x4), float32
MM = _record(IO([[], []], [[8, 16], [16, 4]], ["Tensor(float)", "Tensor(float)"]),
             IO([[]], [[8, 4]], ["Tensor(float)"]))


def test_matmul_work() -> None:
    work = op_work("aten::mm", MM)
    assert work is not None and work.flops == 2 * 8 * 16 * 4
    assert work.bytes == 4 * (8 * 16 + 16 * 4 + 8 * 4)


def test_no_work_outside_the_families_or_without_shapes() -> None:
    assert op_work("aten::unknown_op", MM) is None
    assert op_work("aten::mm", _record(IO([], [], []), IO([], [], []))) is None


def test_elementwise_and_foreach() -> None:
    add = _record(IO([[], []], [[10], [10]], ["Tensor(c10::Half)", "Tensor(c10::Half)"]),
                  IO([[]], [[10]], ["Tensor(c10::Half)"]))
    work = op_work("aten::add", add)
    assert work is not None and (work.flops, work.bytes) == (10, 2 * 30)
    lists = _record(IO([[[], []]], [[[3], [5]]], ["GenericList[Tensor(float),Tensor(float)]"]), IO([], [], []))
    work = op_work("aten::_foreach_add_", lists)
    assert work is not None and (work.flops, work.bytes) == (8, 4 * 8)


def test_spread_sums_to_the_total() -> None:
    assert spread(10, [1.0, 1.0, 1.0]) == [4, 3, 3]
    assert spread(7, [0.0, 0.0]) == [4, 3]  # no weight: equal shares
    assert spread(100, [3.0, 1.0]) == [75, 25]
    assert spread(5, []) == []


def test_assign_spreads_over_the_launched_events() -> None:
    items = [
        Item(id=1, kind=HOST_OP, name="aten::mm", start=0, dur=100, measured=True, tid=1, host=MM),
        Item(id=2, kind=RUNTIME, name="cudaLaunchKernel", start=10, dur=5, measured=True, tid=1, enclosing=1),
        Item(id=3, kind=RUNTIME, name="cudaMemcpyAsync", start=20, dur=5, measured=True, tid=1, enclosing=1),
        Item(id=4, kind=KERNEL, name="gemm", start=30, dur=30, measured=True, launcher=2),
        Item(id=5, kind=MEMCPY, name="Memcpy DtoD", start=60, dur=10, measured=True, launcher=3),
        Item(id=6, kind=KERNEL, name="stray", start=80, dur=5, measured=True),  # no launch: nothing known
        Item(id=7, kind=KERNEL, name="nccl", start=90, dur=5, measured=True, launcher=2,
             comm=Comm(0, "allreduce", 0, 16)),  # communication: not a roofline node
    ]
    rf = assign(Graph(items=items, by_id={it.id: it for it in items}, ids=Ids(100)))
    flops, nbytes = 2 * 8 * 16 * 4, 4 * (8 * 16 + 16 * 4 + 8 * 4)
    assert rf.values == {4: (flops * 3 // 4, nbytes * 3 // 4), 5: (flops // 4, nbytes // 4)}
    assert (rf.gpu_time_us, rf.gpu_time_covered_us, rf.ops) == (45, 40, {"matmul": 1})


def test_ops_without_shapes_give_no_work_and_their_gpu_time_still_counts() -> None:
    # a Kineto trace recorded without shapes: no op's record has an input or output, nothing is walked up to
    empty = _record(IO([], [], []), IO([], [], []))
    items = [
        Item(id=1, kind=HOST_OP, name="aten::mm", start=0, dur=100, measured=True, tid=1, host=empty),
        Item(id=2, kind=RUNTIME, name="cudaLaunchKernel", start=10, dur=5, measured=True, tid=1, enclosing=1),
        Item(id=3, kind=KERNEL, name="gemm", start=30, dur=30, measured=True, launcher=2),
    ]
    rf = assign(Graph(items=items, by_id={it.id: it for it in items}, ids=Ids(100)))
    assert (rf.values, rf.gpu_time_us, rf.gpu_time_covered_us, rf.ops) == ({}, 30, 0, {})
    # one op with shapes anywhere in the trace: the walks are made (the matmul's work is found)
    items.append(Item(id=4, kind=HOST_OP, name="aten::add", start=200, dur=1, measured=True, tid=1, host=MM))
    items[0].host = MM
    rf = assign(Graph(items=items, by_id={it.id: it for it in items}, ids=Ids(100)))
    assert rf.values == {3: (2 * 8 * 16 * 4, 4 * (8 * 16 + 16 * 4 + 8 * 4))}
