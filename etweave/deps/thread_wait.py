"""Evidence `thread_wait`: a thread's wake-up follows the op of another thread it waited for (inferred). The finder
says which periods waited for which op (run by the waits stage, which cuts each such period into its wait and a
WAKEUP); the source gives the edges."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import msgspec

from etweave.deps.awaited import awaited
from etweave.deps.evidence import MAX_WAKEUP, Evidence
from etweave.deps.evidence import WAIT_TOLERANCE as TOLERANCE
from etweave.deps.handoff import ISSUE_PREFIXES, Handed
from etweave.deps.timeline import by_end, latest_before, off_thread
from etweave.model import DELAY, HOST_OP, HOST_OP_KIND, SELF_PART, Edge, Graph, Item
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
