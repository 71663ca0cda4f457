"""Evidence `thread_wait`: a thread's wake-up follows the op of another thread it waited for (inferred). The finder
says which periods waited for which op (run by the waits stage, which cuts each such period into its wait and a
WAKEUP); the source gives the edges."""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Collection, Sequence

import msgspec

from etweave.deps.awaited import awaited
from etweave.deps.evidence import MAX_WAKEUP, Evidence
from etweave.deps.evidence import WAIT_TOLERANCE as TOLERANCE
from etweave.deps.handoff import ISSUE_PREFIXES, Handed
from etweave.deps.timeline import by_end, latest_before, off_thread
from etweave.model import DELAY, HOST_OP, HOST_OP_KIND, SELF_PART, UNTRACED, Edge, Graph, Item, RecordTail
from etweave.periods import thread_of

# Only periods at least this long are examined for a hidden wait on another thread (µs).
MIN_WAIT = 20.0
# A thread waiting for a collective it handed over (in the issuing op, or between ops), or for a helper thread it
# joins that has finished its work, may resume later than MAX_WAKEUP on a loaded machine (1.3-3.4 ms seen on 2
# shared cores); the bound keeps a wake-up within a step.
LOADED_MAX_WAKEUP = 10_000.0


def thread_wait(g: Graph) -> list[Edge]:
    """A thread's wake-up after the op of another thread it waited for: a collective its gloo worker ran, the
    backward pass on the autograd engine thread, a helper thread it joined (inferred)."""
    return awaited(g, Evidence.THREAD_WAIT)


class ThreadWait(msgspec.Struct):
    """A period that waited for an op of another thread: from `wait_from` (its start, or the moment it handed the
    work over) until the op ended; `also` are the other collectives it handed over that ended while it waited."""

    period: Item
    op: Item
    wait_from: float
    also: list[Item]


def find_thread_waits(g: Graph, removed: set[int], served: Handed, moments: dict[int | str, list[float]],
                      any_thread: bool = True) -> list[ThreadWait]:
    """A long period of a thread (an op's own time, its later self time, or idle) inside which an op of another
    thread ended was waiting for that op, when either the thread resumed within TOLERANCE of its end (any thread),
    or the op was part of the work this thread handed to another thread (`served`, from the `handoff` finders: the
    gloo worker running the collective it issued, the autograd engine running its backward, a helper thread it
    joins) and it resumed within MAX_WAKEUP. (Another thread's op this thread handed nothing, a periodic background
    thread's, is no wait.) Inferred from that structure and the timing. A period in which the thread also handed
    work over (`moments`: the collective it then waited for) waits from the first such moment. Without
    `any_thread`, only waits for work in `served`."""
    ends, tops = by_end([it for it in g.of_kinds(HOST_OP_KIND) if it.measured and it.enclosing is None
                         and it.tid is not None and it.dur > 0])
    finished = FinishedWork(tops)
    # long enough to have waited first: that test leaves out most items
    periods = [x for x in g.items if not x.seg_end - x.start < MIN_WAIT and x.kind in (HOST_OP, SELF_PART, DELAY)
               and x.measured and x.comm is None and x.tid is not None and x.stream is None and x.id not in removed]
    found: list[ThreadWait] = []
    handing = served.handing()  # (a thread that handed nothing over waits for no handed work: no lookup)
    for it in periods:
        tid = thread_of(it)
        x = latest_before(ends, tops, it.start + TOLERANCE, it.seg_end, off_thread(tid)) if any_thread else None
        if x is None or it.seg_end - (x.start + x.dur) > TOLERANCE:
            x = latest_before(ends, tops, it.start + TOLERANCE, it.seg_end, handed_by(served, tid)) \
                if tid in handing else None
            if x is None or it.seg_end - (x.start + x.dur) > max_wakeup(g, it, x, finished.before(x, it.seg_end)):
                continue
        x_end = x.start + x.dur
        times = moments.get(tid, [])
        k = bisect.bisect_right(times, it.start)
        wait_from = times[k] if k < len(times) and times[k] < x_end else it.start
        # Collectives of the threads it handed work to that ended while it waited were waited for too (DDP's
        # buckets, all waited for at the end of backward): each gates the wake-up, whichever ends last.
        lo = bisect.bisect_left(ends, wait_from)
        also = [o for o in tops[lo:bisect.bisect_left(ends, x_end)]
                if o.comm is not None and served.holds(tid, o) and o is not x]
        found.append(ThreadWait(it, x, wait_from, also))
    return found


def handed_by(served: Handed, tid: int | str) -> Callable[[Item], bool]:
    """Whether an op ran in work thread `tid` handed over."""
    return lambda o: served.holds(tid, o)


class FinishedWork:
    """When each thread started its top-level ops, to tell whether a thread's work was over at a given time."""

    def __init__(self, tops: list[Item]) -> None:
        per: dict[int | str, list[float]] = {}
        for o in tops:
            per.setdefault(thread_of(o), []).append(o.start)
        self.starts = {tid: sorted(s) for tid, s in per.items()}

    def before(self, x: Item, t: float) -> bool:
        """Whether op `x` was the last op its thread started before time t: its work was over when x ended."""
        starts = self.starts.get(thread_of(x), [])
        k = bisect.bisect_right(starts, x.start)
        return k == len(starts) or starts[k] >= t


def max_wakeup(g: Graph, it: Item, x: Item, finished: bool = False) -> float:
    """How late a thread may resume after handed work `x` ended, for its period `it` to count as waiting for it. A
    collective it handed over, awaited in the issuing op's own time (a synchronous `c10d::broadcast_` that has not
    returned) or in time between ops (`work.wait()`, untraced, in `ProfilerStep#k [self]` or idle), is waited for
    however loaded the machine is: without a bound where the period began as the worker took the collective up (the
    thread did nothing traced from the hand-over to its resuming: 10 ms seen on 2 overloaded cores), else up to
    LOADED_MAX_WAKEUP. Other handed work awaited between ops (a join: untraced) whose thread had `finished` (x was
    the last op it started before the waiter resumed, and nothing else it handed over ended after x, see
    find_thread_waits) is waited for up to LOADED_MAX_WAKEUP too; an op's own first period (work of its own), or a
    helper still at work when the waiter resumed, MAX_WAKEUP."""
    if x.comm is None:
        return LOADED_MAX_WAKEUP if finished and it.kind in (SELF_PART, DELAY) else MAX_WAKEUP
    owner = g.by_id.get(it.part_of if it.part_of is not None else it.id)
    issuing = owner is not None and owner.name.startswith(ISSUE_PREFIXES) and owner.start <= x.start
    if not issuing and it.kind not in (SELF_PART, DELAY):
        return MAX_WAKEUP
    return math.inf if it.start <= x.start + MAX_WAKEUP else LOADED_MAX_WAKEUP


# A thread's own time with nothing traced in it: where it may have waited.
IDLE_KINDS = frozenset({SELF_PART, DELAY, UNTRACED})
_START, _SEG_END = operator.attrgetter("start"), operator.attrgetter("seg_end")


def idle_periods(items: Sequence[Item], threads: Collection[int | str], removed: Collection[int] = ()
                 ) -> dict[int | str, list[Item]]:
    """Each of these threads' measured idle periods (`IDLE_KINDS`, at least MIN_WAIT long), by start."""
    idle: dict[int | str, list[Item]] = {}
    for p in items:
        tid = p.tid
        if (tid in threads and p.kind in IDLE_KINDS and p.measured and p.seg_end - p.start >= MIN_WAIT
                and p.id not in removed):
            assert tid is not None  # (threads holds no None)
            idle.setdefault(tid, []).append(p)
    for periods in idle.values():
        periods.sort(key=_START)
    return idle


def resumed_before_end(op: Item, idle: list[Item]) -> Item | None:
    """Of a thread's idle periods (`idle_periods`), the one that began as op's worker took it up (as `max_wakeup`
    takes a hand-over) and ended, the thread resuming, latest while op's record was still open; None if none did."""
    end = op.start + op.dur
    lo = bisect.bisect_left(idle, op.start - TOLERANCE, key=_START)
    hi = bisect.bisect_right(idle, op.start + MAX_WAKEUP, key=_START)
    resumed = [p for p in idle[lo:hi] if op.start < p.seg_end < end - TOLERANCE]
    return max(resumed, key=_SEG_END) if resumed else None


def find_record_tails(g: Graph, removed: Collection[int], served: Sequence[Handed], awaited: Collection[int]
                      ) -> list[RecordTail]:
    """Collectives a gloo worker ran for another thread that no wait was found for (`awaited`: the ops waited for)
    and whose handing thread (`served`), idle from the hand-over, resumed while the record was still open: gloo
    completes a collective's future, waking its waiter, before it ends the record (docs/FACTS.md §W3). Modelled as
    a wait for the collective, complete at that resume, when the thread waited at least as long as the record then
    stayed open (a worker descheduled for longer than the whole wait is not told apart from a thread that merely
    paused after handing over a collective it never waited for) and nothing of the op was traced after the resume
    (its own period reaches it); the others are only named (the audit's `issuer_resumed_before_its_end`)."""
    ops = [x for x in g.of_kinds(HOST_OP_KIND) if x.comm is not None and x.measured and x.stream is None
           and x.tid is not None and x.dur > 0 and x.id not in awaited]
    handing = sorted(set().union(*(s.handing() for s in served)), key=str)
    owners = {x.id: next((t for t in handing if t != x.tid and any(s.holds(t, x) for s in served)), None)
              for x in ops}
    threads = {t for t in owners.values() if t is not None}
    if not threads:  # (the usual case: every handed collective was waited for)
        return []
    idle = idle_periods(g.items, threads, removed)
    tails = []
    cut: set[int] = set()  # periods cut as a wait already: one wait each (a second collective is only named)
    for x in ops:
        tid = owners[x.id]
        p = resumed_before_end(x, idle.get(tid, [])) if tid is not None else None
        if p is not None:
            resumed, end = p.seg_end, x.start + x.dur
            modelled = resumed - p.start >= end - resumed and x.seg_end >= resumed and p.id not in cut
            if modelled:
                cut.add(p.id)
            tails.append(RecordTail(x.id, p.id, end - resumed, modelled))
    return tails
