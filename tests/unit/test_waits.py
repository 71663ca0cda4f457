"""The waits stage (period surgery) on hand-built threads and streams: what each finder records as awaited, how the
waiting time is cut out of the periods, and the items it adds."""

from __future__ import annotations

import pytest

from etweave.chakra.schema import ALL_REDUCE, COMM_COLL_NODE
from etweave.deps.evidence import MAX_WAKEUP, Evidence
from etweave.deps.thread_wait import MIN_WAIT, idle_periods, resumed_before_end
from etweave.model import (
    DELAY,
    HOST_OP,
    KERNEL,
    RESUME,
    RUNTIME,
    SELF_PART,
    THREAD_ROOT,
    UNTRACED,
    WAKEUP,
    Await,
    Comm,
    Graph,
    Item,
    RecordTail,
)
from etweave.periods import Chains
from etweave.waits import resolve_waits

from .graphs import graph, host_op


def _period(i: int, kind: str, name: str, start: float, dur: float, tid: int | None = 1, **kw: object) -> Item:
    """A measured item whose first period is all of it (unless `seg_end` is given)."""
    it = Item(i, kind, name, start=start, dur=dur, excl=dur, seg_end=start + dur, measured=True, tid=tid)
    for k, v in kw.items():
        setattr(it, k, v)
    return it


def _kernel(i: int, start: float, dur: float, launcher: int | None, stream: int = 7) -> Item:
    return _period(i, KERNEL, f"kernel{i}", start, dur, tid=None, launcher=launcher, device=0, stream=stream)


def _added(g: Graph, before: int) -> list[Item]:
    return [it for it in g.items if it.id >= before]


def test_a_blocking_sync_keeps_its_entry_and_resumes_after_the_gpu_op_it_waited_for() -> None:
    root, launch = Item(1, THREAD_ROOT, "t1", tid=1), _period(2, RUNTIME, "cudaLaunchKernel", 0.0, 5.0)
    sync = _period(3, RUNTIME, "cudaStreamSynchronize", 10.0, 90.0)
    kernel = _kernel(4, 20.0, 70.0, launcher=2)
    g = graph(root, launch, sync, kernel, threads={1: [1, 2, 3]}, streams={(0, 7): [4]})
    resolve_waits(g)
    resume, idle = _added(g, 5)
    assert sync.seg_end == sync.start == 10.0, "the call keeps no waiting time"
    assert (resume.kind, resume.part_of, resume.start, resume.seg_end) == (RESUME, 3, 90.0, 100.0)
    assert resume.awaits == [Await(4, Evidence.SYNC, False)]
    assert g.threads[1] == [1, 2, 3, resume.id]
    # the kernel began 15 µs after its launch returned, with nothing else on the device: idle on its stream
    assert (idle.kind, idle.name, idle.start, idle.seg_end) == (DELAY, "[gpu idle]", 5.0, 20.0)
    assert idle.awaits == [Await(2, Evidence.LAUNCH, False)]
    assert g.streams[(0, 7)] == [idle.id, 4]


def _two_streams(b_start: float) -> Graph:
    calls = [_period(1, RUNTIME, "cudaLaunchKernel", 0.0, 1.0), _period(2, RUNTIME, "cudaLaunchKernel", 1.0, 1.0)]
    a, b = _kernel(3, 0.5, 49.5, launcher=1, stream=7), _kernel(4, b_start, 10.0, launcher=2, stream=8)
    return graph(*calls, a, b, threads={1: [1, 2]}, streams={(0, 7): [3], (0, 8): [4]})


def test_a_late_gpu_op_waited_for_the_op_of_another_stream_that_ended_just_before() -> None:
    g = _two_streams(b_start=53.0)
    resolve_waits(g)
    assert g.by_id[4].awaits == [Await(3, Evidence.STREAM_WAIT, True)]
    assert not _added(g, 5), "no idle time: it started within the tolerance of the awaited end"


def test_a_gpu_op_later_still_waited_then_idled() -> None:
    g = _two_streams(b_start=80.0)
    resolve_waits(g)
    (idle,) = _added(g, 5)
    assert not g.by_id[4].awaits
    assert (idle.start, idle.seg_end, idle.dur) == (50.0, 80.0, 30.0)
    assert idle.awaits == [Await(2, Evidence.LAUNCH, False), Await(3, Evidence.STREAM_WAIT, True)]
    assert g.streams[(0, 8)] == [idle.id, 4]


def test_an_unrecorded_stream_wait_event_waits_for_the_last_op_launched_on_another_stream() -> None:
    calls = [_period(1, RUNTIME, "cudaLaunchKernel", 0.0, 1.0), _period(2, RUNTIME, "cudaStreamWaitEvent", 5.0, 1.0),
             _period(3, RUNTIME, "cudaLaunchKernel", 7.0, 1.0)]
    nccl, compute = _kernel(4, 3.0, 37.0, launcher=1, stream=7), _kernel(5, 45.0, 5.0, launcher=3, stream=8)
    g = graph(*calls, nccl, compute, threads={1: [1, 2, 3]}, streams={(0, 7): [4], (0, 8): [5]})
    resolve_waits(g)
    assert compute.awaits == [Await(4, Evidence.EVENT_WAIT, True)]
    assert not _added(g, 6), "ready when the awaited op ended: no stream wait, no idle time"


def test_a_thread_that_resumed_as_another_threads_op_ended_waited_for_it() -> None:
    waiting, other = _period(2, HOST_OP, "join", 0.0, 200.0), _period(4, HOST_OP, "work", 50.0, 147.0, tid=2)
    g = graph(Item(1, THREAD_ROOT, "t1", tid=1), waiting, Item(3, THREAD_ROOT, "t2", tid=2), other,
              threads={1: [1, 2], 2: [3, 4]})
    resolve_waits(g)
    (wake,) = _added(g, 5)
    assert waiting.seg_end == waiting.start, "the op keeps a zero-length node where the wait began"
    assert (wake.kind, wake.start, wake.seg_end, wake.part_of) == (WAKEUP, 197.0, 200.0, 2)
    assert wake.awaits == [Await(4, Evidence.THREAD_WAIT, True)]
    assert g.threads[1] == [1, 2, wake.id]


def test_main_thread_hands_a_helper_work_and_waits_for_it() -> None:
    main_op = _period(2, HOST_OP, "spawn_and_join", 0.0, 100.0)
    gap = _period(4, DELAY, "[idle]", 0.0, 50.0, tid=2)
    helper = _period(5, HOST_OP, "helper_work", 50.0, 10.0, tid=2)
    g = graph(Item(1, THREAD_ROOT, "t1", tid=1), main_op, Item(3, THREAD_ROOT, "t2", tid=2), gap, helper,
              threads={1: [1, 2], 2: [3, 4, 5]})
    resolve_waits(g)
    assert helper.awaits == [Await(2, Evidence.HANDOFF, True)], "handed over by the op running then"
    assert 4 not in g.by_id and g.threads[2] == [3, 5], "the helper's idle time became the edge"
    (wake,) = _added(g, 6)
    assert main_op.seg_end == 50.0, "the main op ran until it handed the work over, then waited"
    assert (wake.kind, wake.start, wake.seg_end) == (WAKEUP, 60.0, 100.0)
    assert wake.awaits == [Await(5, Evidence.THREAD_WAIT, True)], "a wait for the work it handed over, 40 µs late"


def test_idle_time_between_ops_that_nothing_explains_is_untraced_and_before_the_first_op_idle() -> None:
    idle = _period(2, DELAY, "[idle]", 0.0, 10.0)
    gap = _period(4, DELAY, "[idle]", 20.0, 30.0)
    g = graph(Item(1, THREAD_ROOT, "t1", tid=1), idle, _period(3, HOST_OP, "a", 10.0, 10.0), gap,
              _period(5, HOST_OP, "b", 50.0, 10.0), threads={1: [1, 2, 3, 4, 5]})
    resolve_waits(g)
    assert (idle.kind, idle.name) == (DELAY, "[idle]")
    assert (gap.kind, gap.name, gap.dur) == (UNTRACED, "[untraced]", 30.0)
    assert g.threads[1] == [1, 2, 3, 4, 5] and len(g.items) == 5


def test_period_chains_keep_their_starts_in_step_with_cuts_and_moves() -> None:
    a, b = _period(2, HOST_OP, "a", 0.0, 100.0), _period(3, HOST_OP, "b", 100.0, 50.0)
    g = graph(Item(1, THREAD_ROOT, "t1", tid=1), a, b, threads={1: [1, 2, 3]})
    chains = Chains(g)
    assert chains.starts(1) == [0.0, 0.0, 100.0]
    tail = chains.split(a, 40.0, SELF_PART)
    assert (tail.kind, tail.start, tail.seg_end, tail.part_of, a.seg_end) == (SELF_PART, 40.0, 100.0, 2, 40.0)
    assert chains.ids[1] == [1, 2, tail.id, 3]
    chains.move_start(b, 3, 120.0)
    assert b.start == 120.0
    assert chains.starts(1) == [g.by_id[i].start for i in chains.ids[1]] == [0.0, 0.0, 40.0, 120.0]
    assert chains.last_period(a) is tail


def test_set_start_keeps_the_starts_in_step_and_last_period_needs_no_starts_kept() -> None:
    # zero-length periods at one start: the moved one is found among them by its id
    a, z = _period(2, HOST_OP, "a", 0.0, 100.0), _period(3, RUNTIME, "z", 100.0, 0.0)
    b = _period(4, HOST_OP, "b", 100.0, 50.0)
    g = graph(Item(1, THREAD_ROOT, "t1", tid=1), a, z, b, threads={1: [1, 2, 3, 4]})
    fresh = Chains(g)
    assert fresh.last_period(a) is a  # (no starts kept: found on the chain by each period's start)
    assert not fresh._starts
    chains = Chains(g)
    assert chains.starts(1) == [0.0, 0.0, 100.0, 100.0]
    tail = chains.split(a, 40.0, SELF_PART)
    chains.set_start(b, 120.0)
    chains.set_start(tail, 60.0)
    assert (b.start, tail.start) == (120.0, 60.0)
    assert chains.starts(1) == [g.by_id[i].start for i in chains.ids[1]] == [0.0, 0.0, 60.0, 100.0, 120.0]
    assert chains.last_period(a) is tail
    chains._starts.clear()
    assert chains.last_period(a) is tail and chains.last_period(b) is b


def _join(helper_more: Item | None = None) -> Graph:
    """The main thread starts a helper (which begins 5 µs later), works 1 ms, then joins it between ops (untraced
    `join()`, idle); the helper's 5 ms of work ends at 5005, the main thread resumes 1995 µs later (a loaded
    machine: later than MAX_WAKEUP)."""
    main_work, join = _period(2, HOST_OP, "main_work", 0.0, 1000.0), _period(3, DELAY, "[idle]", 1000.0, 6000.0)
    after = _period(4, HOST_OP, "after", 7000.0, 10.0)
    gap, helper = _period(6, DELAY, "[idle]", 0.0, 5.0, tid=2), _period(7, HOST_OP, "helper_work", 5.0, 5000.0, tid=2)
    more = [helper_more] if helper_more is not None else []
    return graph(Item(1, THREAD_ROOT, "t1", tid=1), main_work, join, after, Item(5, THREAD_ROOT, "t2", tid=2), gap,
                 helper, *more, threads={1: [1, 2, 3, 4], 2: [5, 6, 7, *(it.id for it in more)]})


def test_a_join_that_resumed_late_after_the_helper_finished_waited_for_it() -> None:
    g = _join()
    resolve_waits(g)
    assert g.by_id[7].awaits == [Await(2, Evidence.HANDOFF, True)], "the helper was started by the main thread"
    (wake,) = (it for it in g.items if it.kind == WAKEUP)
    assert (wake.tid, wake.start, wake.seg_end) == (1, 5005.0, 7000.0), "the join's wake-up, 1995 µs long"
    assert wake.awaits == [Await(7, Evidence.THREAD_WAIT, True)]
    assert 3 not in g.threads[1], "the idle time was all waiting"


def test_a_join_whose_helper_was_still_at_work_when_the_thread_resumed_is_no_late_wait() -> None:
    g = _join(_period(8, HOST_OP, "helper_more", 5100.0, 3000.0, tid=2))  # still running at 7000
    resolve_waits(g)
    assert not [it for it in g.items if it.kind == WAKEUP], "the helper had not finished: no wait beyond 1 ms"
    assert (g.by_id[3].kind, g.by_id[3].dur) == (UNTRACED, 6000.0)


def test_a_hand_over_drawn_from_another_thread_than_the_credited_one_is_credited_and_waited_for() -> None:
    """The main thread calls `backward()`: it hands the engine thread its first work, then blocks. While it is
    blocked, the engine hands a worker a collective (reading tensor 9 the engine wrote, and tensor 8 the main thread
    wrote): the first pass credits the main thread (asked first, its blocking period then still looked busy); once
    its wait is cut out, the hand-over edge comes from the engine, which must be credited with it too: its idle
    wait for that collective (resumed 60 µs after it ended) is a wait, not untraced time."""
    fwd = _period(2, HOST_OP, "fwd", 0.0, 10.0, host=host_op(2, "fwd", writes=(8,)))
    backward = _period(3, HOST_OP, "backward", 10.0, 990.0)
    engine_gap = _period(5, DELAY, "[idle]", 0.0, 20.0, tid=2)
    bwd_fn = _period(6, HOST_OP, "bwd_fn", 20.0, 380.0, tid=2, host=host_op(6, "bwd_fn", writes=(9,)))
    engine_idle, after = _period(7, DELAY, "[idle]", 400.0, 360.0, tid=2), _period(8, HOST_OP, "after", 760.0, 10.0,
                                                                                   tid=2)
    w0, worker_gap = _period(10, HOST_OP, "w0", 1.0, 4.0, tid=3), _period(11, DELAY, "[idle]", 5.0, 295.0, tid=3)
    coll = _period(12, HOST_OP, "all_reduce", 300.0, 400.0, tid=3, host=host_op(12, "all_reduce", reads=(8, 9)))
    g = graph(Item(1, THREAD_ROOT, "t1", tid=1), fwd, backward, Item(4, THREAD_ROOT, "t2", tid=2), engine_gap, bwd_fn,
              engine_idle, after, Item(9, THREAD_ROOT, "t3", tid=3), w0, worker_gap, coll,
              threads={1: [1, 2, 3], 2: [4, 5, 6, 7, 8], 3: [9, 10, 11, 12]})
    resolve_waits(g)
    assert bwd_fn.awaits == [Await(3, Evidence.HANDOFF, True)], "backward() handed the engine its first work"
    assert coll.awaits == [Await(6, Evidence.HANDOFF, True)], "the engine, running then, handed the collective over"
    wakes = {it.tid: it for it in g.items if it.kind == WAKEUP}
    assert (wakes[2].start, wakes[2].seg_end, wakes[2].awaits) == (700.0, 760.0, [Await(12, Evidence.THREAD_WAIT,
                                                                                         True)])
    assert 7 not in g.threads[2], "the engine's idle time was all waiting for the collective it handed over"
    assert not [it for it in g.items if it.kind == UNTRACED]
    assert wakes[1].seg_end == 1000.0 and backward.seg_end == 20.0, "backward() waited from its hand-over on"


def test_by_end_orders_items_by_end_then_id_with_their_ends() -> None:
    from etweave.deps.timeline import by_end
    a, b, c = Item(3, KERNEL, "a", start=0.0, dur=5.0), Item(1, KERNEL, "b", start=2.0, dur=3.0), \
        Item(2, KERNEL, "c", start=1.0, dur=1.0)
    ends, ops = by_end([a, b, c])
    assert ends == [2.0, 5.0, 5.0]
    assert [o.id for o in ops] == [2, 1, 3]  # equal ends: by id
    assert by_end([]) == ([], [])


def test_handed_names_only_the_threads_that_handed_work_over() -> None:
    from etweave.deps.handoff import Handed
    handed = Handed()
    assert handed.handing() == set()
    handed.add("main", 7, 0.0, 10.0)
    handed.stretches[("helper", "main")]  # (a key looked up, no stretch: hands nothing)
    assert handed.handing() == {"main"}


def _record_tail(resumed: float) -> Graph:
    """Thread 1 issues an all_reduce (writing tensor 8) that a gloo worker, thread 2, runs from 100 to 10000 µs
    (reading tensor 8), then is idle until `resumed`, before the record's end: gloo woke it, then ended the record
    (docs/FACTS.md §W3)."""
    issue = _period(2, HOST_OP, "c10d::allreduce_", 0.0, 100.0, host=host_op(2, "c10d::allreduce_", writes=(8,)))
    idle, after = _period(3, DELAY, "[idle]", 100.0, resumed - 100.0), _period(4, HOST_OP, "after", resumed, 50.0)
    gap = _period(6, DELAY, "[idle]", 0.0, 100.0, tid=2)
    coll = _period(7, HOST_OP, "gloo:all_reduce", 100.0, 9900.0, tid=2, host=host_op(7, "gloo:all_reduce", reads=(8,)),
                   comm=Comm(COMM_COLL_NODE, "allreduce", ALL_REDUCE, 1024))
    return graph(Item(1, THREAD_ROOT, "t1", tid=1), issue, idle, after, Item(5, THREAD_ROOT, "t2", tid=2), gap, coll,
                 threads={1: [1, 2, 3, 4], 2: [5, 6, 7]})


def test_a_thread_that_resumed_before_the_record_of_its_collective_ended_waited_for_it() -> None:
    g = _record_tail(8200.0)
    resolve_waits(g)
    coll = g.by_id[7]
    assert g.record_tails == [RecordTail(7, 3, 1800.0, True)]
    # the collective ends where the thread resumed; the record's rest is the worker's, after it
    assert (coll.start, coll.dur, coll.seg_end, coll.comm and coll.comm.record_tail) == (100.0, 8100.0, 8200.0, 1800.0)
    (tail,) = [it for it in g.items if it.name == "gloo:all_reduce [record tail]"]
    assert (tail.kind, tail.tid, tail.start, tail.seg_end, tail.part_of) == (SELF_PART, 2, 8200.0, 10000.0, 7)
    assert g.threads[2][-2:] == [7, tail.id]
    # the idle time was all waiting: a wake-up of no length after the collective
    (wake,) = [it for it in g.items if it.kind == WAKEUP and it.tid == 1]
    assert (wake.tid, wake.start, wake.seg_end, wake.awaits) == (1, 8200.0, 8200.0, [Await(7, Evidence.THREAD_WAIT,
                                                                                          True)])
    assert 3 not in g.threads[1]


def test_a_record_that_stayed_open_longer_than_the_thread_waited_is_only_named() -> None:
    g = _record_tail(2000.0)  # waited 1900 µs, the record open 8000 µs more: not told from a pause
    resolve_waits(g)
    assert g.record_tails == [RecordTail(7, 3, 8000.0, False)]
    assert (g.by_id[7].dur, g.by_id[7].comm and g.by_id[7].comm.record_tail) == (9900.0, 0.0)
    assert not [it for it in g.items if (it.kind == WAKEUP and it.tid == 1) or "[record tail]" in it.name]
    assert g.by_id[3].kind == UNTRACED


@pytest.mark.parametrize(("start", "end", "kind", "measured", "found"), [
    (200.0, 8_200.0, DELAY, True, True),
    (200.0, 8_200.0, SELF_PART, True, True),
    (200.0, 8_200.0, UNTRACED, True, True),
    (95.0, 130.0, DELAY, True, True),  # a short wait, from the hand-over
    (100.0 + MAX_WAKEUP + 1, 8_200.0, DELAY, True, False),  # the thread did traced work after the hand-over first
    (200.0, 200.0 + MIN_WAIT - 1, DELAY, True, False),  # too short to have waited
    (200.0, 10_000.0, DELAY, True, False),  # resumed at the record's end: a wait the finders see, not this case
    (200.0, 8_200.0, HOST_OP, True, False),  # an op of its own, not idle time
    (200.0, 8_200.0, DELAY, False, False),  # placed, not measured
])
def test_the_idle_period_a_thread_resumed_from_before_a_record_ended(start: float, end: float, kind: str,
                                                                       measured: bool, found: bool) -> None:
    """`resumed_before_end`: a record from 100 to 10000 µs, and one period of the thread that handed it over."""
    coll = _period(7, HOST_OP, "gloo:all_reduce", 100.0, 9900.0, tid=2)
    period = _period(3, kind, "p", start, end - start, measured=measured)
    idle = idle_periods([coll, period], {1})
    assert resumed_before_end(coll, idle.get(1, [])) is (period if found else None)


def test_two_collectives_whose_records_outlasted_one_wait_cut_it_once() -> None:
    """As `_record_tail(8200)`, with a second worker, thread 3, running a second such all_reduce."""
    base = _record_tail(8200.0)
    twin = _period(10, HOST_OP, "gloo:all_reduce", 100.0, 9900.0, tid=3,
                   host=host_op(10, "gloo:all_reduce", reads=(8,)),
                   comm=Comm(COMM_COLL_NODE, "allreduce", ALL_REDUCE, 1024))
    g = graph(*base.items, Item(8, THREAD_ROOT, "t3", tid=3), _period(9, DELAY, "[idle]", 0.0, 100.0, tid=3), twin,
              threads={**base.threads, 3: [8, 9, 10]})
    resolve_waits(g)
    assert sorted(t.op for t in g.record_tails) == [7, 10]
    assert [t.modelled for t in g.record_tails].count(True) == 1, "the one wait is cut once"
    assert len([it for it in g.items if it.kind == WAKEUP and it.tid == 1]) == 1
