"""Stage infer_dependencies, first part, waits: time a thread or stream spent waiting becomes an edge, never a duration.

The wait finders of etweave.deps (`sync`, `event_wait`, `thread_wait`, `handoff`, `stream_wait`, one module each
with its source) look at the measured timeline and say what each waiting period waited for; this stage records it
on the waiting item (`Item.awaits`, which those sources turn into edges) and cuts the waiting time out of the
periods: a blocking CUDA call keeps a zero-length node where it began and gets a RESUME node for what it did after
the wait was over; a thread that waited for another thread keeps a zero-length node where the wait began and ends
in a WAKEUP node, from the awaited end to its resuming (the measured latency); an idle gap explained by a handoff
from another thread disappears (or becomes the worker's WAKEUP). Waits between threads are found from structure
(which thread handed which thread work), whatever the wake-up latency up to MAX_WAKEUP. What no evidence explains
stays a fixed duration: UNTRACED between a thread's ops, an `[idle]` DELAY before its first op or on a GPU stream.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections import defaultdict

import msgspec

from etweave.deps.awaited import waiting
from etweave.deps.cuda_sync import SyncRecords
from etweave.deps.event_wait import recorded_event_waits, unrecorded_event_waits
from etweave.deps.evidence import MAX_WAKEUP, Evidence
from etweave.deps.evidence import WAIT_TOLERANCE as TOLERANCE
from etweave.deps.handoff import Handed, HandOverEvidence, hand_over, main_thread, stretch_end
from etweave.deps.stream_wait import find_late_start
from etweave.deps.sync import find_blocking_calls
from etweave.deps.thread_wait import ThreadWait, find_record_tails, find_thread_waits
from etweave.deps.timeline import by_end, latest_before
from etweave.model import (
    DELAY,
    GPU_KINDS,
    HOST_OP_KIND,
    RESUME,
    SELF_PART,
    THREAD_ROOT,
    UNTRACED,
    WAKEUP,
    Await,
    Graph,
    Item,
    first_measured_start,
)
from etweave.periods import Chains


def resolve_waits(g: Graph) -> None:
    g.waiting = None  # (found again below)
    chains = Chains(g)
    records = SyncRecords(g)
    recorded_event_waits(g, records)
    unrecorded_event_waits(g, records)
    _blocking_calls(g, chains, records)
    evidence = HandOverEvidence(g)
    givers: dict[int, int | str] = {}  # idle gap -> the thread credited with the hand-over after it
    handed, moments = _handoffs(g, chains, evidence, givers, apply=False)  # who handed which work, when: the waits
    woken: list[Item] = []  # the wake-ups of the waits between threads (found in either pass)
    waited = _cross_thread_waits(g, chains, handed, moments, woken)
    # after the waits: a thread's waiting time is not taken for handing, so a hand-over may now be found from
    # another thread than the one credited; every hand-over drawn is credited, and waits for that work found too
    late, late_moments = _handoffs(g, chains, evidence, givers, apply=True)
    if late.stretches:
        waited = _cross_thread_waits(g, chains, late, late_moments, woken, waited)
    _record_tails(g, chains, [handed, late], waited, woken)
    _await_last_periods(g, chains, woken)
    _name_untraced(g, chains)
    chains.store()
    _stream_waits(g)
    g.waiting = list(waiting(g))  # the waits are all recorded: the wait sources read them from here


def _blocking_calls(g: Graph, chains: Chains, records: SyncRecords) -> None:
    """A blocking call that waited for a GPU op (deps.sync) keeps its entry; the rest of it waited: a RESUME node
    from the awaited end."""
    for call, op in find_blocking_calls(g, records):
        resume = chains.split(call, call.start, RESUME)  # the call's own node keeps its entry; the rest waited
        chains.set_start(resume, min(max(resume.start, op.start + op.dur), resume.seg_end))
        resume.wait_for(Await(op.id, Evidence.SYNC, False))


def _cross_thread_waits(g: Graph, chains: Chains, served: Handed, moments: dict[int | str, list[float]],
                        woken: list[Item], again: set[int] | None = None) -> set[int]:
    """A period that waited for another thread's op (deps.thread_wait) is cut where the wait began: the time from
    the awaited end to the period's end is a WAKEUP node on the waiting thread, as long as the measured latency,
    after the edge from that op (and from the other collectives it handed over that ended while it waited). With
    `again` (the periods found waiting before), only waits for work `served` holds, in periods not cut yet. The
    WAKEUP nodes are added to `woken`; returns the periods found waiting."""
    found = find_thread_waits(g, chains.removed | (again or set()), served, moments, any_thread=again is None)
    for w in found:
        _wake_after(chains, w, woken)
    return {w.period.id for w in found} | (again or set())


def _wake_after(chains: Chains, w: ThreadWait, woken: list[Item]) -> None:
    """Cut period `w.period` where its wait began: a WAKEUP node from the awaited end to the period's end, after
    edges from the awaited op and `w.also` (added to `woken`)."""
    it, x_end = w.period, w.op.start + w.op.dur
    wake = chains.split(it, w.wait_from, WAKEUP)
    chains.set_start(wake, min(x_end, wake.seg_end))
    wake.dur = wake.excl = wake.seg_end - wake.start
    wake.wait_for(Await(w.op.id, Evidence.THREAD_WAIT, True))
    wake.wait_for(*(Await(o.id, Evidence.THREAD_WAIT, True) for o in w.also))
    woken.append(wake)
    if it.kind == DELAY and w.wait_from == it.start:  # the idle period was all waiting: only its wake-up is left
        chains.removed.add(it.id)


def _record_tails(g: Graph, chains: Chains, served: list[Handed], waited: set[int], woken: list[Item]) -> None:
    """A collective whose handing thread resumed before its record ended (deps.thread_wait.find_record_tails):
    where modelled, the collective ends at that resume (`dur`; the record's rest is a `[record tail]` period of it
    on the worker's thread, `Comm.record_tail` its length) and the thread's idle period waited for it, cut as
    `_cross_thread_waits` cuts a wait (a wake-up of no length: when it completed is known only by that resume).
    All are kept for the audit (`Graph.record_tails`)."""
    awaited = {a.item for wake in woken for a in wake.awaits or ()}
    g.record_tails = find_record_tails(g, chains.removed | waited, served, awaited)
    for tail in g.record_tails:
        if not tail.modelled:
            continue
        x, period = g.by_id[tail.op], g.by_id[tail.period]
        assert x.comm is not None  # (a collective: find_record_tails picks only those)
        resumed = period.seg_end
        rest = chains.split(x, resumed, SELF_PART)
        rest.name = f"{x.name} [record tail]"
        x.dur = resumed - x.start  # (its `excl` stays all of its self time, the tail's included, as with `[self]`)
        x.comm.record_tail = tail.tail
        _wake_after(chains, ThreadWait(period, x, period.start, []), woken)


def _await_last_periods(g: Graph, chains: Chains, woken: list[Item]) -> None:
    """A thread waited for an op of another thread to end: the edge comes from the op's last period on its thread
    (the op may have been cut into periods after the wait was found). Only the wake-ups `woken` record such waits
    (`_cross_thread_waits`): they are read, not every item."""
    for it in woken:
        awaits = it.awaits
        assert isinstance(awaits, list)  # (waiting: it recorded some)
        for n, a in enumerate(awaits):
            x = g.by_id[a.item]
            if a.evidence is not Evidence.THREAD_WAIT or x.tid is None:
                continue
            last = chains.last_period(x)
            if last.id != a.item:
                awaits[n] = Await(last.id, a.evidence, a.inferred)


def _name_untraced(g: Graph, chains: Chains) -> None:
    """Idle time on a thread between its ops that no evidence says was waiting is code the profiler did not record
    (Python between ops, data loading): it stays a fixed duration, named for what it is. Idle time before a
    thread's first op that no hand-over explains stays an `[idle]` delay: the thread had not started working."""
    removed = chains.removed
    for order in chains.ids.values():
        by_id = g.by_id
        kinds = [by_id[i].kind for i in order]  # (a comprehension: an attrgetter in C costs twice its step per item)
        # the thread started at its first period (its root and removed ones aside); each idle one after is untraced
        first = next((k for k, (i, kind) in enumerate(zip(order, kinds, strict=True))
                      if kind != THREAD_ROOT and i not in removed), len(order))
        for pos in itertools.compress(range(len(order)), map(operator.eq, kinds, itertools.repeat(DELAY))):
            if pos > first and order[pos] not in removed:
                idle = g.by_id[order[pos]]
                idle.kind, idle.name = UNTRACED, "[untraced]"


def _handoffs(g: Graph, chains: Chains, evidence: HandOverEvidence, givers: dict[int, int | str],
              apply: bool) -> tuple[
        Handed, dict[int | str, list[float]]]:
    """An idle gap on a worker thread ends when another thread hands it work (inferred). If that thread was running
    an op at that moment, the op is cut there and the gap becomes an edge from its first part; if it had just
    entered a wait (a zero-length blocking node while the gap was open, e.g. `backward()` handing the engine its
    first task), the gap becomes a WAKEUP node from that moment, after an edge from it. The main thread's gaps are
    not handoffs (Python work, data loading). Before a thread's first op, the thread was started (by the main
    thread's untraced code too); after it, the timing alone is no hand-over: the handing thread must show one
    (HandOverEvidence), else the gap stays the woken thread's own (untraced) time. Returns the work each thread
    handed over, and thread -> the moments it did (sorted); with `apply` False nothing is changed and `givers`
    (idle gap -> the thread credited with the hand-over after it) is filled in; with `apply` the work is handed
    over by threads not credited with it before (their waits for it are still to find)."""
    handed = Handed()
    moments: dict[int | str, list[float]] = defaultdict(list)
    main = main_thread(g, chains)
    if main is None:
        return handed, moments
    for tid in sorted(chains.ids, key=str):
        if tid == main:
            continue
        # who may have handed work over, in the order asked: the main thread first
        by = [main, *(t for t in sorted(chains.ids, key=str) if t not in (tid, main))]
        given = _worker_handoffs(g, chains, evidence, _Worker(tid, by, moments, givers), apply)
        for k, (giver, lo, hi, gap) in enumerate(given):
            until = given[k + 1][1] if k + 1 < len(given) else math.inf  # the worker's next hand-over
            if not apply or givers.get(gap) != giver:
                handed.add(giver, tid, lo, hi if hi is not None else until)
    for times in moments.values():
        times.sort()
    handed.sort()
    return handed, moments


class _Worker(msgspec.Struct):
    """A thread whose idle gaps may end in a hand-over, the threads that may have handed it work (in the order
    asked, the main thread first), the moments each thread handed work over (filled in) and the thread credited
    with the hand-over after each idle gap (filled in by the first pass)."""

    tid: int | str
    by: list[int | str]
    moments: dict[int | str, list[float]]
    givers: dict[int, int | str]

    def credit(self, gap: Item, by: int | str, moment: float, apply: bool) -> None:
        """Thread `by` handed over the work after `gap` at `moment`."""
        self.moments[by].append(moment)
        if not apply:
            self.givers[gap.id] = by


# A hand-over of work: by whom, from when, to when (None: until the worker's next hand-over), after which idle gap.
_Given = tuple[int | str, float, float | None, int]


def _worker_handoffs(g: Graph, chains: Chains, evidence: HandOverEvidence, worker: _Worker,
                     apply: bool) -> list[_Given]:
    """The hand-overs that ended the idle gaps of one worker thread (see _handoffs), recorded and applied with
    `apply`."""
    order = chains.ids[worker.tid]  # (nothing here changes this thread's order: other threads' periods are cut)
    by_id = g.by_id
    kinds = [by_id[i].kind for i in order]  # (a comprehension: an attrgetter in C costs twice its step per item)
    # the worker has started once a period of its own work came before (not its root, idle or waking up)
    first_work = next((k for k, kind in enumerate(kinds) if kind not in (THREAD_ROOT, DELAY, WAKEUP)), len(kinds))
    given: list[_Given] = []
    # each idle gap but the last period, picked in C
    for pos in itertools.compress(range(len(order) - 1), map(operator.eq, kinds, itertools.repeat(DELAY))):
        gap = by_id[order[pos]]
        if gap.id in chains.removed:
            continue
        started = first_work < pos
        nxt = by_id[order[pos + 1]]
        found, moment, queued = hand_over(g, chains, evidence, worker.by, gap, nxt, started, worker.by[0])
        if queued is not None:  # the worker took it up after its previous work: its idle time stays its own
            if queued.tid is not None:
                worker.credit(gap, queued.tid, moment, apply)
                given.append((queued.tid, nxt.start, None, gap.id))
            if apply:
                nxt.wait_for(Await(queued.id, Evidence.HANDOFF, True))
            continue
        if found is None:
            continue
        src, running = found
        if src.tid is not None:
            worker.credit(gap, src.tid, moment, apply)
            # Work handed over with evidence (a collective, a backward pass) runs until the worker is handed work
            # again, across idle time of its own (the engine waiting inside the backward pass); a thread merely
            # started was handed its first stretch of work, up to its first idle time.
            given.append((src.tid, nxt.start, None if started else stretch_end(g, order, pos + 1), gap.id))
        if apply:
            _apply_handoff(chains, gap, nxt, src, running, pos)
    return given


def _apply_handoff(chains: Chains, gap: Item, nxt: Item, src: Item, running: bool, pos: int) -> None:
    """The idle `gap` (at `pos` of its thread) before `nxt` ends in a hand-over from `src`: the op `src` was running
    is cut there and the gap disappears; or, `src` having begun to wait, the gap becomes the worker's WAKEUP."""
    if running:
        if src.seg_end - nxt.start >= 0.5 and nxt.start - src.start >= 0.5:
            chains.split(src, nxt.start, SELF_PART if src.kind != RESUME else RESUME)
        nxt.wait_for(Await(src.id, Evidence.HANDOFF, True))
        chains.removed.add(gap.id)
        return
    # the worker woke up after the handing thread began to wait: that latency is a wake-up
    gap.kind, gap.name = WAKEUP, "[wake-up]"
    chains.move_start(gap, pos, max(gap.start, src.seg_end if src.seg_end > src.start
                                    else math.nextafter(src.start, math.inf)))
    gap.dur = gap.excl = gap.seg_end - gap.start
    gap.wait_for(Await(src.id, Evidence.HANDOFF, True))


def _stream_waits(g: Graph) -> None:
    """A GPU op that started later than its stream and its launch allowed waited for something: another stream's
    op that ended just before (deps.stream_wait), else idle (a DELAY)."""
    by_device: dict[int, list[Item]] = defaultdict(list)
    for it in g.of_kinds(GPU_KINDS):
        by_device[it.device or 0].append(it)
    index = {dev: by_end(ops) for dev, ops in by_device.items()}
    t0 = first_measured_start(g)
    for key, order in list(g.streams.items()):
        new_order: list[int] = []
        prev: Item | None = None
        for i in order:
            it = g.by_id[i]
            # A stream starts idle at the run's first instant: a first op with no launch record waited from there.
            free = prev.start + prev.dur if prev else t0
            # (an op that began within TOLERANCE of its stream's being free was ready no earlier: not late, no call)
            idle = _late_start(g, it, key, free, index) if it.start - free > TOLERANCE else None
            if idle is not None:
                new_order.append(idle.id)
            new_order.append(i)
            prev = it
        g.streams[key] = new_order


def _late_start(g: Graph, it: Item, key: tuple[int, int], stream_free: float,
                index: dict[int, tuple[list[float], list[Item]]]) -> Item | None:
    """A GPU op on stream `key` that started late (deps.stream_wait) waited for another stream's op that ended
    within TOLERANCE before it (a `stream_wait` edge), and was idle before it where it started later still (a
    `[gpu idle]` DELAY, returned)."""
    late = find_late_start(g, it, key[1], stream_free, index.get(key[0]))
    if late is None:
        return None
    if late.waited and late.other is not None:
        it.wait_for(Await(late.other.id, Evidence.STREAM_WAIT, True))
    if it.start - late.idle_from <= TOLERANCE:
        return None
    d = g.add(Item(id=0, kind=DELAY, name="[gpu idle]", start=late.idle_from, seg_end=it.start, measured=True,
                   device=key[0], stream=key[1]))
    d.dur = d.excl = it.start - late.idle_from
    # the idle time starts once whatever made the op ready is done: its launch, an event waited on, or the op on
    # another stream it waited for
    if late.launch is not None:
        d.wait_for(Await(late.launch.id, Evidence.LAUNCH, False))
    d.wait_for(*(a for a in it.awaits if a.evidence is Evidence.EVENT_WAIT))
    if late.other is not None and late.idle_from > late.ready:
        d.wait_for(Await(late.other.id, Evidence.STREAM_WAIT, True))
    return d


class NoWaitEvidence:
    """Why delay periods that stayed fixed durations were not taken for waits: what ended elsewhere while they ran
    (indexed once, on first need, so the report can ask for every long delay of a large trace)."""

    def __init__(self, g: Graph) -> None:
        self.g = g

    @functools.cached_property
    def tops(self) -> tuple[list[Item], list[float]]:
        """The top-level host ops of every thread, by end."""
        ends, tops = by_end([o for o in self.g.of_kinds(HOST_OP_KIND) if o.measured and o.enclosing is None
                             and o.tid is not None])
        return tops, ends

    @functools.cached_property
    def gpu(self) -> dict[int | None, tuple[list[Item], list[float]]]:
        """Each device's GPU ops, by end."""
        per: dict[int | None, list[Item]] = defaultdict(list)
        for o in self.g.of_kinds(GPU_KINDS):
            per[o.device].append(o)
        gpu = {}
        for dev, ops in per.items():
            ends, ops = by_end(ops)
            gpu[dev] = (ops, ends)
        return gpu

    def of(self, it: Item) -> str:
        end = it.seg_end
        if it.stream is not None:  # idle on a GPU stream
            ops, ends = self.gpu.get(it.device, ([], []))
            last = latest_before(ends, ops, it.start, end + TOLERANCE, lambda o: o.stream != it.stream)
            if last is None:
                return "no op on another stream of its device ended while the stream was idle"
            return (f"the last op on another stream to end ({last.name}, stream {last.stream}) ended "
                    f"{end - last.start - last.dur:.0f} us before the idle time did (> {TOLERANCE:.0f} us)")
        tops, ends = self.tops
        last = latest_before(ends, tops, math.nextafter(it.start, math.inf), end, lambda o: o.tid != it.tid)
        if last is None:
            return "no op of another thread ended during it: nothing it could have waited for"
        gap = end - last.start - last.dur
        if gap > MAX_WAKEUP:
            return (f"the last op of another thread to end during it ({last.name}, thread {last.tid}) ended "
                    f"{gap:.0f} us before it did (> {MAX_WAKEUP:.0f} us)")
        return (f"the last op of another thread to end during it ({last.name}, thread {last.tid}) ended {gap:.0f} us "
                f"before it did, but this thread handed that thread no work (> {TOLERANCE:.0f} us)")


def no_wait_evidence(g: Graph, it: Item) -> str:
    """NoWaitEvidence for one delay period."""
    return NoWaitEvidence(g).of(it)
