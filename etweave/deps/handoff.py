"""Evidence `handoff`: a worker thread's first op (or wake-up) after idle follows the op of the thread that handed it
work (inferred). The finders say which thread handed which work, when (run by the waits stage, which cuts the
periods where work was handed over); the source gives the edges."""

from __future__ import annotations

import bisect
import math
import operator
from collections import defaultdict

from etweave.deps.awaited import awaited
from etweave.deps.evidence import MAX_WAKEUP, Evidence
from etweave.model import (
    DELAY,
    HOST_OP,
    HOST_OP_KIND,
    OP_KINDS,
    RESUME,
    RUNTIME,
    SELF_PART,
    THREAD_ROOT,
    Edge,
    Graph,
    Item,
    OpRecord,
)
from etweave.periods import Chains


def handoff(g: Graph) -> list[Edge]:
    """A worker thread's first op (or wake-up) after the op of the thread that handed it work (inferred)."""
    return awaited(g, Evidence.HANDOFF)


class Handed:
    """The work each thread handed to other threads: per (handing thread, worker thread), the worker's stretches of
    that work (from the op it was handed to its next hand-over; a thread merely started, to its first idle time),
    so a wait is only ever for work the waiter handed over."""

    def __init__(self) -> None:
        self.stretches: dict[tuple[int | str, int | str], list[tuple[float, float]]] = defaultdict(list)

    def add(self, by: int | str, worker: int | str, lo: float, hi: float) -> None:
        self.stretches[(by, worker)].append((lo, hi))

    def sort(self) -> None:
        for spans in self.stretches.values():
            spans.sort()

    def handing(self) -> set[int | str]:
        """The threads that handed some work over (`holds` is False for every op and any other thread)."""
        return {by for (by, _), spans in self.stretches.items() if spans}

    def holds(self, by: int | str, op: Item) -> bool:
        """Whether `op` ran in work that thread `by` handed to op's thread."""
        spans = self.stretches.get((by, op.tid)) if op.tid is not None else None
        if not spans:
            return False
        k = bisect.bisect_right(spans, (op.start, math.inf)) - 1
        return k >= 0 and spans[k][0] <= op.start < spans[k][1]


# Ops that hand work to another thread of the process: issuing a collective that a gloo worker runs.
ISSUE_PREFIXES = ("c10d::",)


class HandOverEvidence:
    """What says that a thread handed the work a woken thread then ran, beyond the timing (a thread that wakes up on
    its own, a periodic background thread, is handed nothing): the handing thread issued a collective since the
    worker went idle and the worker runs a collective; the worker runs backward functions of ops the handing thread
    ran forward (autograd sequence ids); or the worker's op reads a tensor the handing thread wrote (a collective
    queued while the worker was still busy with the previous one: the issuing op wrote its tensor)."""

    def __init__(self, g: Graph) -> None:
        self.issued: dict[int | str, tuple[list[float], list[Item]]] = {}  # thread -> its collective issues
        self.ops: dict[int | str, tuple[list[float], list[Item]]] = {}  # thread -> its host ops by start
        # autograd: (host ET thread, sequence id) -> the thread of its forward op; every thread counts sequence ids
        # from 0, and a backward op names its forward op's ET thread (`fw_tid`). Without fw_tid in the trace
        # (Kineto alone) the key's thread is 0 and the first op of a sequence id is taken as its forward op.
        self.forward_tid: dict[tuple[int, int], int | str] = {}
        self.names_forward_thread = _names_forward_thread(g.of_kinds(OP_KINDS))
        # (tensor, storage, thread) -> the starts of that thread's ops that wrote the tensor, and the ops, in
        # (start, id) order: the latest writer by a time is one bisection, not a scan of every writer
        self.writers: dict[tuple[int, int, int | str], tuple[list[float], list[Item]]] = {}
        per: dict[int | str, list[Item]] = defaultdict(list)
        for it in g.of_kinds(HOST_OP_KIND):  # (in id order)
            if it.tid is not None and it.measured:
                per[it.tid].append(it)
        first: dict[tuple[int, int], Item] = {}  # forward key -> the first op of it, by (start, id)
        for tid, ops in per.items():
            starts = [it.start for it in ops]  # (a comprehension: an attrgetter in C costs twice its step per item)
            if not all(map(operator.le, starts, starts[1:])):  # (in id order: by (start, id) unless a start goes back)
                ops.sort(key=_START_ID)
                starts = [it.start for it in ops]
            self.ops[tid] = (starts, ops)
            issuing = [it for it in ops if it.name.startswith(ISSUE_PREFIXES)]
            if issuing:
                self.issued[tid] = (list(map(_START, issuing)), issuing)
            self._index_records(tid, ops, first)
        self.forward_tid = {key: it.tid for key, it in first.items() if it.tid is not None}

    def _index_records(self, tid: int | str, ops: list[Item], first: dict[tuple[int, int], Item]) -> None:
        """The tensors thread `tid`'s ops (by start) wrote, and the first op of each forward key so far."""
        for it in ops:
            h = it.host
            if h is None:
                continue
            if h.seq_id >= 0 and not h.fw_tid:
                key = self._forward_key(h.et_tid, h.seq_id)
                was = first.get(key)
                if was is None or (it.start, it.id) < (was.start, was.id):
                    first[key] = it
            for _, tensor, storage, _, _ in h.output_tensors:
                w_starts, w_ops = self.writers.setdefault((tensor, storage, tid), ([], []))
                w_starts.append(it.start)
                w_ops.append(it)

    def shows(self, by: int | str, gap: Item, woken: Item) -> tuple[bool, Item | None]:
        """Whether thread `by` handed over the work that `woken` (the first period after the idle `gap` of its
        thread) begins, and the op of `by` that handed it over where the evidence names one (it ended by then)."""
        t = woken.start
        starts, ops = self.ops.get(woken.tid, ([], [])) if woken.tid is not None else ([], [])
        window = ops[bisect.bisect_left(starts, t):bisect.bisect_right(starts, t + max(woken.dur,
                                                                                      woken.seg_end - woken.start))]
        if any(o.comm is not None for o in window):  # the woken op and the ops inside it
            i_starts, i_ops = self.issued.get(by, ([], []))
            k = bisect.bisect_right(i_starts, t) - 1
            if k >= 0 and i_starts[k] >= gap.start:  # a collective issued by `by` while the worker was idle
                op = i_ops[k]
                return True, op if op.start + op.dur <= t else None
        for o in window:
            h = o.host
            if h is None:
                continue
            if self._backward_of(h) == by and o.tid != by:
                return True, None  # the backward of an op `by` ran forward: `by` called backward()
            for _, tensor, storage, _, _ in h.input_tensors:
                wrote = self.writers.get((tensor, storage, by))
                k = bisect.bisect_right(wrote[0], t) if wrote is not None else 0
                if wrote is not None and k:  # reads what `by` wrote: handed over as data
                    w = wrote[1][k - 1]  # the latest writer by then; an issuing op names the hand-over
                    return True, w if w.start + w.dur <= t and w.name.startswith(ISSUE_PREFIXES) else None
        return False, None


    def _forward_key(self, et_tid: int, seq_id: int) -> tuple[int, int]:
        return (et_tid if self.names_forward_thread else 0), seq_id

    def _backward_of(self, h: OpRecord) -> int | str | None:
        """The thread that ran the forward op of backward op `h`, or None when `h` is no backward op."""
        if h.seq_id < 0 or (self.names_forward_thread and not h.fw_tid):
            return None
        return self.forward_tid.get(self._forward_key(h.fw_tid, h.seq_id))


def _names_forward_thread(ops: list[Item]) -> bool:
    """Whether any op's host record names its forward op's thread (`fw_tid`): the first found ends the search."""
    for it in ops:
        h = it.host
        if h is not None and h.fw_tid:
            return True
    return False
_START_ID, _START = operator.attrgetter("start", "id"), operator.attrgetter("start")


def main_thread(g: Graph, chains: Chains) -> int | str | None:
    """The thread that began working first (of the longest chain on a tie); None with fewer than two threads that
    worked: nothing was handed over."""
    firsts = {tid: next((g.by_id[i].start for i in order if g.by_id[i].kind not in (THREAD_ROOT, DELAY)), None)
              for tid, order in chains.ids.items()}
    timed = {t: s for t, s in firsts.items() if s is not None}
    if len(timed) < 2:
        return None
    return min(timed, key=lambda t: (timed[t], -len(chains.ids[t]), str(t)))


def hand_over(g: Graph, chains: Chains, evidence: HandOverEvidence, by: list[int | str], gap: Item, nxt: Item,
              started: bool, main: int | str) -> tuple[tuple[Item, bool] | None, float, Item | None]:
    """Who of `by` (in that order) handed over the work `nxt` begins after the idle `gap`: the handing period (and
    whether it was running, see handing; the `main` thread's untraced code hands work over too), the moment of the
    hand-over, and the issuing op's last period where the work was queued while the worker was still busy (the
    handing thread long blocked by then)."""
    moment = nxt.start
    for t in by:
        f = handing(g, chains, t, gap, nxt.start, idle_hands=t == main)
        shown, issuer = evidence.shows(t, gap, nxt) if started else (f is not None, None)
        if not shown:
            continue
        queued = None
        if issuer is not None and issuer.start + issuer.dur <= gap.start and nxt.start - gap.start <= MAX_WAKEUP:
            # queued while the worker was still busy: handed over when the issuing op ended, not when the worker
            # got to it (the handing thread's wait for it began then)
            moment = issuer.start + issuer.dur
            if f is None:  # the handing thread is long blocked by now (waiting for this very work)
                queued = chains.last_period(issuer)
        if f is not None or queued is not None:
            return f, moment, queued
    return None, moment, None


def stretch_end(g: Graph, order: list[int], pos: int) -> float:
    """When the busy stretch of a thread that begins at order[pos] ends: at its next idle period (or never)."""
    for i in order[pos + 1:]:
        if g.by_id[i].kind == DELAY:
            return g.by_id[i].start
    return math.inf


def handing(g: Graph, chains: Chains, tid: int | str, gap: Item, t: float,
             idle_hands: bool = False) -> tuple[Item, bool] | None:
    """The period of thread `tid` that handed work to a thread whose idle `gap` ended at t: the op it was running
    then (True), or the blocking node it had entered while the gap was open, within MAX_WAKEUP (False). With
    `idle_hands` (the main thread), its untraced code (Python calling `backward()`, starting a thread) hands work
    over too; a worker's idle time is only waiting."""
    running = executing(g, chains, tid, t, idle_hands)
    if running is not None:
        return running, True
    order = chains.ids[tid]
    k = bisect.bisect_right(chains.starts(tid), t) - 1
    while k >= 0 and order[k] in chains.removed:
        k -= 1
    if k < 0:
        return None
    last = g.by_id[order[k]]
    if (last.kind != THREAD_ROOT and (idle_hands or last.kind != DELAY) and last.seg_end > last.start
            and t - last.seg_end < 0.5):
        return last, True  # it ended as the gap did (a period cut where it handed the work over)
    if (last.kind in (HOST_OP, RUNTIME, SELF_PART, RESUME) and last.seg_end == last.start
            and gap.start <= last.start and t - last.start <= MAX_WAKEUP):
        return last, False
    return None


def executing(g: Graph, chains: Chains, tid: int | str, t: float, idle: bool) -> Item | None:
    """The period running on thread `tid` at time t, if any (an idle period only with `idle`)."""
    order = chains.ids[tid]
    starts = chains.starts(tid)  # periods are in start order
    k = bisect.bisect_right(starts, t) - 1
    while k >= 0:
        it = g.by_id[order[k]]
        if order[k] in chains.removed:
            k -= 1
            continue
        if it.kind != THREAD_ROOT and (idle or it.kind != DELAY) and it.start <= t < max(it.seg_end, it.start + 1e-9):
            return it
        if it.seg_end <= t:
            return None
        k -= 1
    return None
