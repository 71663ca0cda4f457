"""Each evidence source on a small hand-built graph: the edges it gives, with its own evidence."""

from __future__ import annotations

from etweave.chakra import et_def_pb2 as pb
from etweave.deps import SOURCES, sources
from etweave.deps.cuda_sync import SyncRecords
from etweave.deps.evidence import MAX_WAKEUP, Evidence
from etweave.deps.handoff import Handed, HandOverEvidence
from etweave.deps.stream_wait import find_late_start
from etweave.deps.sync import find_blocking_calls
from etweave.deps.thread_wait import find_thread_waits, max_wakeup
from etweave.model import HOST_OP, KERNEL, MEMCPY, PROCESS_ROOT, RESUME, RUNTIME, THREAD_ROOT, Await, Comm, Edge, Item

from .graphs import graph, host_op


def _pairs(edges: list[Edge]) -> list[tuple[int, int]]:
    return [(e.src, e.dst) for e in edges]


def test_thread_order_chains_each_thread_and_hangs_thread_roots_on_the_process_root() -> None:
    g = graph(Item(1, PROCESS_ROOT, "root"), Item(2, THREAD_ROOT, "t1"), Item(3, HOST_OP, "a", tid=1),
              Item(4, HOST_OP, "b", tid=1), Item(5, THREAD_ROOT, "t2"), Item(6, HOST_OP, "c", tid=2),
              threads={1: [2, 3, 4], 2: [5, 6]})
    edges = sources.thread_order(g)
    assert _pairs(edges) == [(2, 3), (3, 4), (5, 6), (1, 2), (1, 5)]
    assert {e.source for e in edges} == {Evidence.THREAD_ORDER} and not any(e.inferred for e in edges)


def test_launch_links_call_to_kernel_and_to_the_idle_time_before_it() -> None:
    call = Item(1, RUNTIME, "cudaLaunchKernel", tid=1)
    kernel = Item(2, KERNEL, "k", launcher=1, device=0, stream=7)
    idle = Item(3, "delay", "[gpu idle]", device=0, stream=7, awaits=[Await(1, Evidence.LAUNCH, False)])
    edges = sources.launch(graph(call, kernel, idle))
    assert edges == [Edge(1, 2, Evidence.LAUNCH), Edge(1, 3, Evidence.LAUNCH)]


def test_stream_order_chains_each_stream() -> None:
    g = graph(*(Item(i, KERNEL, f"k{i}") for i in (1, 2, 3, 4)), streams={(0, 7): [1, 3], (0, 8): [2, 4]})
    assert _pairs(sources.stream_order(g)) == [(1, 3), (2, 4)]


def test_autograd_ties_backward_ops_on_another_thread_to_their_forward_op() -> None:
    fwd = Item(1, HOST_OP, "mm", start=0.0, tid=1, host=host_op(1, "mm", seq_id=5))
    bwd = Item(2, HOST_OP, "MmBackward", start=10.0, tid=2, host=host_op(2, "MmBackward", seq_id=5))
    inner = Item(3, HOST_OP, "mm", start=11.0, tid=2, enclosing=2, host=host_op(3, "mm", seq_id=5))
    same_thread = Item(4, HOST_OP, "add", start=12.0, tid=1, host=host_op(4, "add", seq_id=5))
    other_seq = Item(5, HOST_OP, "add", start=13.0, tid=2, host=host_op(5, "add", seq_id=6))
    edges = sources.autograd(graph(fwd, bwd, inner, same_thread, other_seq))
    assert edges == [Edge(1, 2, Evidence.AUTOGRAD)], "one edge per backward op, not to ops inside it or on its thread"


def test_autograd_takes_no_op_that_began_while_the_forward_op_ran_for_its_backward() -> None:
    """A fresh thread's forward ops have sequence number 0 like the main thread's: an op of one thread that started
    while the other's was still running is no backward of it."""
    main_mm = Item(1, HOST_OP, "aten::matmul", start=0.0, dur=100.0, tid=1, host=host_op(1, "aten::matmul", seq_id=0))
    helper_mm = Item(2, HOST_OP, "aten::matmul", start=50.0, dur=100.0, tid=2,
                     host=host_op(2, "aten::matmul", seq_id=0))
    assert sources.autograd(graph(main_mm, helper_mm)) == []


def test_tensor_flow_only_across_threads() -> None:
    writer = Item(1, HOST_OP, "loss", start=0.0, tid=1, host=host_op(1, "loss", writes=(10,)))
    same = Item(2, HOST_OP, "add", start=1.0, tid=1, host=host_op(2, "add", reads=(10,)))
    other = Item(3, HOST_OP, "c10d::allreduce_", start=2.0, tid=2, host=host_op(3, "c10d::allreduce_", reads=(10,)))
    unrelated = Item(4, HOST_OP, "mul", start=3.0, tid=2, host=host_op(4, "mul", reads=(11,)))
    assert sources.tensor_flow(graph(writer, same, other, unrelated)) == [Edge(1, 3, Evidence.TENSOR_FLOW)]


def _coll(i: int, start: float, dur: float, seq: int | None, pg: str = "0") -> Item:
    return Item(i, KERNEL, f"nccl{i}", start=start, dur=dur,
                comm=Comm(pb.COMM_COLL_NODE, "allreduce", pb.ALL_REDUCE, 8, pg_name=pg, seq=seq))


def test_collective_order_by_seq_within_a_group_and_not_between_overlapping_ones() -> None:
    first, second = _coll(1, 10.0, 10.0, seq=0), _coll(2, 50.0, 10.0, seq=1)
    third = _coll(3, 120.0, 10.0, seq=2)
    overlapping = _coll(4, 121.0, 10.0, seq=3)  # began before the third ended: no "after it is done" edge
    other_group = _coll(5, 200.0, 1.0, seq=0, pg="1")
    edges = sources.collective_order(graph(overlapping, third, other_group, second, first))
    assert _pairs(edges) == [(1, 2), (2, 3)]
    assert {e.source for e in edges} == {Evidence.COLLECTIVE_ORDER}


def test_wait_sources_turn_each_recorded_wait_into_an_edge_of_its_evidence() -> None:
    waiter = Item(3, RESUME, "sync [resumed]", awaits=[
        Await(1, Evidence.SYNC, False), Await(2, Evidence.THREAD_WAIT, True), Await(4, Evidence.EVENT_WAIT, True)])
    other = Item(5, KERNEL, "k", awaits=[Await(1, Evidence.EVENT_WAIT, False), Await(2, Evidence.STREAM_WAIT, True),
                                          Await(6, Evidence.HANDOFF, True)])
    g = graph(waiter, other)
    assert SOURCES[Evidence.SYNC](g) == [Edge(1, 3, Evidence.SYNC, False)]
    assert SOURCES[Evidence.EVENT_WAIT](g) == [Edge(4, 3, Evidence.EVENT_WAIT, True),
                                              Edge(1, 5, Evidence.EVENT_WAIT, False)]
    assert SOURCES[Evidence.STREAM_WAIT](g) == [Edge(2, 5, Evidence.STREAM_WAIT, True)]
    assert SOURCES[Evidence.THREAD_WAIT](g) == [Edge(2, 3, Evidence.THREAD_WAIT, True)]
    assert SOURCES[Evidence.HANDOFF](g) == [Edge(6, 5, Evidence.HANDOFF, True)]


def test_every_registered_source_gives_edges_of_its_own_evidence() -> None:
    items = [Item(1, PROCESS_ROOT, "root"), Item(2, THREAD_ROOT, "t"),
             Item(3, RUNTIME, "cudaLaunchKernel", tid=1),
             Item(4, KERNEL, "k", launcher=3, device=0, stream=7, comm=_coll(0, 0, 0, 0).comm,
                  awaits=[Await(3, e, False) for e in SOURCES]),
             Item(5, HOST_OP, "bwd", tid=2, start=1.0, host=host_op(5, "bwd", seq_id=1, reads=(1,))),
             _coll(6, 5.0, 1.0, seq=1),
             Item(7, HOST_OP, "fwd", tid=1, start=0.5, host=host_op(7, "fwd", seq_id=1, writes=(1,)))]
    g = graph(*items, threads={1: [2, 3]}, streams={(0, 7): [4, 6]})
    for evidence, source in SOURCES.items():
        edges = source(g)
        assert edges, f"{evidence} finds its edge in the graph made for all of them"
        assert {e.source for e in edges} == {evidence}


def _measured(i: int, kind: str, name: str, start: float, dur: float, tid: int | None = 1, **kw: object) -> Item:
    it = Item(i, kind, name, start=start, dur=dur, excl=dur, seg_end=start + dur, measured=True, tid=tid)
    for k, v in kw.items():
        setattr(it, k, v)
    return it


def test_sync_finder_takes_the_gpu_op_that_ended_last_during_a_blocking_call() -> None:
    launch = _measured(1, RUNTIME, "cudaLaunchKernel", 0.0, 2.0)
    sync_call = _measured(2, RUNTIME, "cudaDeviceSynchronize", 10.0, 90.0)
    early = _measured(3, KERNEL, "early", 2.0, 5.0, tid=None, launcher=1, device=0, stream=7)  # done before
    first = _measured(4, KERNEL, "first", 12.0, 40.0, tid=None, launcher=1, device=0, stream=7)
    last = _measured(5, KERNEL, "last", 52.0, 50.0, tid=None, launcher=1, device=0, stream=8)  # ends 2 µs late
    copy = _measured(6, RUNTIME, "cudaMemcpy", 200.0, 20.0)
    dma = _measured(7, MEMCPY, "Memcpy DtoH", 205.0, 30.0, tid=None, launcher=6, device=0, stream=7)
    g = graph(launch, sync_call, early, first, last, copy, dma)
    found = find_blocking_calls(g, SyncRecords(g))
    assert [(c.id, o.id) for c, o in found] == [(2, 5), (6, 7)], "a copy waits for its own DMA (covered half of it)"


def test_thread_wait_finder_waits_for_the_op_of_another_thread_that_ended_as_the_period_did() -> None:
    waiting = _measured(1, HOST_OP, "join", 0.0, 200.0)
    other = _measured(2, HOST_OP, "work", 50.0, 147.0, tid=2)
    short = _measured(3, HOST_OP, "short", 0.0, 10.0, tid=3)  # under MIN_WAIT: not examined
    (w,) = find_thread_waits(graph(waiting, other, short), set(), Handed(), {})
    assert (w.period, w.op, w.wait_from, w.also) == (waiting, other, 0.0, [])
    assert max_wakeup(graph(waiting, other), waiting, other) == MAX_WAKEUP, "no collective: the plain bound"


def test_stream_wait_finder_says_what_a_late_gpu_op_waited_for() -> None:
    call = _measured(1, RUNTIME, "cudaLaunchKernel", 0.0, 1.0)
    a = _measured(2, KERNEL, "a", 0.5, 49.5, tid=None, device=0, stream=7)
    b = _measured(3, KERNEL, "b", 53.0, 10.0, tid=None, launcher=1, device=0, stream=8)
    g = graph(call, a, b)
    ends = ([50.0, 63.0], [a, b])
    assert find_late_start(g, a, 7, 0.0, ends) is None, "started as soon as it could"
    late = find_late_start(g, b, 8, 0.0, ends)
    assert late is not None
    assert (late.launch, late.ready, late.other, late.waited, late.idle_from) == (call, 1.0, a, True, 53.0)


def test_handoff_evidence_a_worker_reading_what_the_handing_thread_wrote() -> None:
    issue = _measured(1, HOST_OP, "c10d::allreduce_", 0.0, 10.0, host=host_op(1, "c10d::allreduce_", writes=(9,)))
    gap = _measured(2, "delay", "[idle]", 5.0, 15.0, tid=2)
    work = _measured(3, HOST_OP, "gloo:all_reduce", 20.0, 30.0, tid=2, host=host_op(3, "x", reads=(9,)))
    evidence = HandOverEvidence(graph(issue, gap, work))
    assert evidence.shows(1, gap, work) == (True, issue), "handed over by the issuing op, which ended by then"
    assert evidence.shows(3, gap, work) == (False, None), "thread 3 wrote nothing it reads"
