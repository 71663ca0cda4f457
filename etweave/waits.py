"""Stage 5a, waits: time a thread or stream spent waiting becomes an edge, never a duration.

Each finder looks at the measured timeline, records on the waiting item what it waited for (`Item.awaits`,
turned into edges by the evidence sources `sync`, `event_wait`, `stream_wait`, `thread_wait` and `handoff` in
etweave.deps.sources), and cuts the waiting time out of the node: a blocking CUDA call keeps a zero-length node
where it began and gets a RESUME node for what it did after the wait was over; a thread that waited for another
thread keeps a zero-length node where the wait began and ends in a WAKEUP node, from the awaited end to its
resuming (the measured latency); an idle gap explained by a handoff from another thread disappears (or becomes
the worker's WAKEUP). Waits between threads are found from structure (which thread handed which thread work),
whatever the wake-up latency up to MAX_WAKEUP. What no evidence explains stays a fixed duration: UNTRACED between
a thread's ops, an `[idle]` DELAY before its first op or on a GPU stream.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

from etweave.model import (
    DELAY,
    GPU_KINDS,
    HOST_OP,
    MEMCPY,
    RESUME,
    RUNTIME,
    SELF_PART,
    THREAD_ROOT,
    UNTRACED,
    WAKEUP,
    Graph,
    Item,
    SyncRecord,
)

# A waiter resumes within this long after what it waited for ended (µs), as FORMATS.md's traces show.
TOLERANCE = 5.0
# Only periods at least this long are examined for a hidden wait on another thread (µs).
MIN_WAIT = 20.0
# A thread waiting for work it handed to another thread (a gloo worker, the autograd engine, a helper thread)
# resumes up to this long after that work ended (µs): 78-283 µs on CPU gloo runs (FORMATS.md, "Waiting on CPU
# threads"); the bound keeps a period that merely overlapped the other thread's work from being taken as a wait.
MAX_WAKEUP = 1000.0
# A thread waiting for a collective it handed over (in the issuing op, or between ops) may resume later than
# MAX_WAKEUP on a loaded machine (1.3-3.4 ms seen on 2 shared cores); the bound keeps a wake-up within a step.
ISSUER_MAX_WAKEUP = 10_000.0
_SYNC_WORDS = ("Synchronize",)
_COPY_PREFIXES = ("cudaMemcpy", "hipMemcpy", "cuMemcpy")


def resolve_waits(g: Graph) -> None:
    chains = _Chains(g)
    records = _SyncRecords(g)
    _event_waits(g, records)
    _unrecorded_event_waits(g, records)
    _blocking_calls(g, chains, records)
    evidence = _HandOverEvidence(g)
    handed, moments = _handoffs(g, chains, evidence, apply=False)  # who handed which work, when: for the waits
    _cross_thread_waits(g, chains, handed, moments)
    _handoffs(g, chains, evidence, apply=True)  # after the waits: a thread's waiting time is not taken for handing
    _await_last_periods(g, chains)
    _name_untraced(g, chains)
    chains.store()
    _stream_waits(g)


class _Chains:
    """Thread chains with their period starts, kept sorted while periods are split."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.ids: dict[int | str, list[int]] = {tid: list(order) for tid, order in g.threads.items()}
        self.removed: set[int] = set()
        # Period starts per thread, parallel to `ids`: built on first use by _executing (once every start is
        # final) and kept in step by split, so lookups are O(log n) instead of a rebuild per call.
        self._starts: dict[int | str, list[float]] = {}

    def starts(self, tid: int | str) -> list[float]:
        s = self._starts.get(tid)
        if s is None:
            s = self._starts[tid] = [self.g.by_id[i].start for i in self.ids[tid]]
        return s

    def reset_starts(self) -> None:
        """Forget the period starts after periods were moved: rebuilt from the items on next use."""
        self._starts.clear()

    def split(self, it: Item, at: float, kind: str) -> Item:
        """Cut `it`'s period at `at`: `it` keeps [start, at], a new item of `kind` takes [at, end]."""
        owner: int | None = it.part_of if it.part_of is not None else it.id
        name = self.g.by_id[owner].name if owner in self.g.by_id else it.name
        if it.kind == DELAY:  # an idle period belongs to no op
            owner, name = None, ""
        suffix = {RESUME: "[resumed]", WAKEUP: "[wake-up]"}.get(kind, "[self]")
        tail = Item(id=0, kind=kind, name=f"{name} {suffix}".strip(), part_of=owner,
                    start=at, seg_end=max(at, it.seg_end), measured=True, tid=it.tid)
        tail.dur = tail.excl = tail.seg_end - at
        it.seg_end = max(it.start, min(it.seg_end, at))
        if it.kind == DELAY:  # an idle period is nothing but its period
            it.dur = it.excl = it.seg_end - it.start
        self.g.add(tail)
        order = self.ids[it.tid]  # type: ignore[index]
        starts = self._starts.get(it.tid)  # type: ignore[arg-type]
        pos = -1
        if starts is not None:  # find the period by its start instead of scanning the chain
            pos = bisect.bisect_left(starts, it.start)
            while pos < len(order) and order[pos] != it.id and starts[pos] == it.start:
                pos += 1
        if not 0 <= pos < len(order) or order[pos] != it.id:
            pos = order.index(it.id)
        order.insert(pos + 1, tail.id)
        if starts is not None:
            starts.insert(pos + 1, at)
        return tail

    def last_period(self, op: Item) -> Item:
        """The last period of `op` still on its thread (an op may have been cut into periods)."""
        order = self.ids[op.tid]  # type: ignore[index]
        end = op.start + op.dur
        k = bisect.bisect_left(self.starts(op.tid), end) - 1  # type: ignore[arg-type]
        while k >= 0 and (order[k] in self.removed or self.g.by_id[order[k]].start < op.start):
            k -= 1
        return self.g.by_id[order[k]] if k >= 0 and self.g.by_id[order[k]].start >= op.start else op

    def store(self) -> None:
        for tid, order in self.ids.items():
            self.g.threads[tid] = [i for i in order if i not in self.removed]
        if self.removed:
            self.g.items = [it for it in self.g.items if it.id not in self.removed]
            for i in self.removed:
                del self.g.by_id[i]


def _gpu_ends(g: Graph) -> tuple[list[float], list[Item]]:
    ops = sorted((it for it in g.items if it.kind in GPU_KINDS), key=lambda it: (it.start + it.dur, it.id))
    return [it.start + it.dur for it in ops], ops


def _latest_before(ends: list[float], ops: list[Item], lo: float, hi: float, ok: object = None) -> Item | None:
    """The item with the latest end in [lo, hi] (that `ok` accepts)."""
    k = bisect.bisect_right(ends, hi)
    while k > 0 and ends[k - 1] >= lo:
        k -= 1
        if ok is None or ok(ops[k]):  # type: ignore[operator]
            return ops[k]
    return None


class _SyncRecords:
    """Kineto `cuda_sync` events (when the profiler recorded them): which stream a sync call waited on, and which
    GPU op a recorded CUDA event stands for (the last op enqueued on its stream before cudaEventRecord)."""

    def __init__(self, g: Graph) -> None:
        self.by_call: dict[int, SyncRecord] = {}  # runtime call correlation -> its cuda_sync event
        self.runtime: dict[int, Item] = {}  # correlation -> runtime item
        for it in g.items:
            if it.kind == RUNTIME and it.correlation is not None:
                self.runtime[it.correlation] = it
        for ev in g.extra.get("cuda_sync", ()):
            if ev.correlation is not None:
                self.by_call[ev.correlation] = ev
        # per (device, stream): GPU ops in launch order, with their launch times
        self.launched: dict[tuple[int, int], tuple[list[float], list[Item]]] = {}
        per: dict[tuple[int, int], list[tuple[float, Item]]] = defaultdict(list)
        for it in g.items:
            if it.kind in GPU_KINDS and it.launcher is not None:
                per[(it.device or 0, it.stream or 0)].append((g.by_id[it.launcher].start, it))
        for key, pairs in per.items():
            pairs.sort(key=lambda p: (p[0], p[1].id))
            self.launched[key] = ([t for t, _ in pairs], [it for _, it in pairs])

    def of(self, call: Item) -> SyncRecord | None:
        corr = call.correlation
        return self.by_call.get(corr) if corr is not None else None

    def recorded_op(self, ev: SyncRecord) -> Item | None:
        """The GPU op a waited-on CUDA event stands for."""
        record = self.runtime.get(ev.wait_on_event_corr or -1)
        stream = ev.wait_on_stream
        if record is None or stream is None or stream < 0:
            return None
        times, ops = self.launched.get((ev.device, stream), ([], []))
        k = bisect.bisect_right(times, record.start)
        return ops[k - 1] if k else None

    def first_launched_after(self, device: int, stream: int, t: float) -> Item | None:
        times, ops = self.launched.get((device, stream), ([], []))
        k = bisect.bisect_left(times, t)
        return ops[k] if k < len(ops) else None


def _event_waits(g: Graph, records: _SyncRecords) -> None:
    """cudaStreamWaitEvent with its `Stream Wait Event` record: the first op enqueued on the waiting stream after
    the call waits for the op the event was recorded after (recorded evidence)."""
    for ev in g.extra.get("cuda_sync", ()):
        if ev.kind != "Stream Wait Event":
            continue
        awaited = records.recorded_op(ev)
        stream = ev.stream
        call = records.runtime.get(ev.correlation or -1)
        if awaited is None or call is None or stream is None or stream < 0:
            continue
        waiter = records.first_launched_after(ev.device, stream, call.start)
        if waiter is not None and waiter is not awaited and awaited.start <= waiter.start:
            waiter.awaits.append((awaited.id, "event_wait", False))


def _unrecorded_event_waits(g: Graph, records: _SyncRecords) -> None:
    """cudaStreamWaitEvent with no `Stream Wait Event` record (most traces): the stream of the next GPU op the
    calling thread launches waits for the event, which was recorded after the last op enqueued on another stream
    before the call (`work.wait()` after a NCCL collective: the compute stream waits for the collective's kernel;
    before one: the NCCL stream waits for its input). Inferred, and kept only where the timeline agrees (the awaited
    op ended before the waiting op started)."""
    calls = sorted((it for it in g.items if it.kind == RUNTIME and it.name.endswith("StreamWaitEvent")
                    and records.of(it) is None), key=lambda it: (it.start, it.id))
    if not calls:
        return
    launches: dict[int | str, list[tuple[float, Item]]] = defaultdict(list)  # thread -> (launch time, GPU op)
    for it in g.items:
        if it.kind in GPU_KINDS and it.launcher is not None:
            call = g.by_id[it.launcher]
            if call.tid is not None:
                launches[call.tid].append((call.start, it))
    for seq in launches.values():
        seq.sort(key=lambda p: (p[0], p[1].id))
    times = {tid: [t for t, _ in seq] for tid, seq in launches.items()}
    done: set[tuple[int, int]] = set()
    for call in calls:
        seq = launches.get(call.tid, [])  # type: ignore[call-overload]
        k = bisect.bisect_right(times.get(call.tid, []), call.start)  # type: ignore[call-overload]
        if k >= len(seq):
            continue
        waiter = seq[k][1]
        earlier = (seq[j][1] for j in range(k - 1, -1, -1))  # walked back, not copied: one call is O(its reach)
        awaited = next((op for op in earlier if op.stream != waiter.stream and op.device == waiter.device), None)
        if awaited is not None and awaited.start + awaited.dur > waiter.start + TOLERANCE:
            # The waiter started before that op ended: the event was recorded before it was enqueued, after an
            # earlier op of the same stream (back-to-back NCCL kernels, then work.wait() for the first).
            awaited = next((seq[j][1] for j in range(k - 1, -1, -1) if seq[j][1].stream == awaited.stream
                            and seq[j][1].device == waiter.device
                            and seq[j][1].start + seq[j][1].dur <= waiter.start + TOLERANCE), None)
        if awaited is None or (awaited.id, waiter.id) in done:
            continue
        if awaited.start + awaited.dur <= waiter.start + TOLERANCE and awaited.start < waiter.start:
            waiter.awaits.append((awaited.id, "event_wait", True))
            done.add((awaited.id, waiter.id))


def _blocking_calls(g: Graph, chains: _Chains, records: _SyncRecords) -> None:
    """cudaStreamSynchronize & co., and copies that ran inside their call, waited for GPU work (recorded). A
    `cuda_sync` record names the stream or event waited on; without one, the GPU op that ended last during the
    call is what it waited for."""
    ends, ops = _gpu_ends(g)
    launched: dict[int, list[Item]] = defaultdict(list)
    for it in g.items:
        if it.launcher is not None:
            launched[it.launcher].append(it)
    for it in [x for x in g.items if x.kind == RUNTIME]:
        end = it.start + it.dur
        awaited: Item | None = None
        if any(w in it.name for w in _SYNC_WORDS):
            record = records.of(it)
            kind = record.kind if record is not None else None
            if record is not None and kind == "Event Sync":
                awaited = records.recorded_op(record)
                if awaited is not None and not it.start <= awaited.start + awaited.dur <= end + TOLERANCE:
                    awaited = None
            elif record is not None and kind == "Stream Sync" and (record.stream or -1) >= 0:
                stream = record.stream
                awaited = _latest_before(ends, ops, it.start, end + TOLERANCE, lambda o, s=stream: o.stream == s)
            else:
                awaited = _latest_before(ends, ops, it.start, end + TOLERANCE)
        elif it.name.startswith(_COPY_PREFIXES):
            # A synchronous copy runs inside its call. A pageable one returns once the last chunk is staged,
            # a little before the DMA ends: the call covered most of the copy, so it waited for it.
            own = [x for x in launched.get(it.id, ()) if x.kind == MEMCPY and x.dur > 0]
            awaited = next((x for x in own if x.start <= end and (x.start + x.dur <= end + TOLERANCE
                                                                  or end - x.start >= 0.5 * x.dur)), None)
        if awaited is None or awaited.start + awaited.dur <= it.start:
            continue
        resume = chains.split(it, it.start, RESUME)  # the call's own node keeps its entry; the rest waited
        resume.start = min(max(resume.start, awaited.start + awaited.dur), resume.seg_end)
        resume.awaits.append((awaited.id, "sync", False))


def _cross_thread_waits(g: Graph, chains: _Chains, served: _Handed, moments: dict[int | str, list[float]]) -> None:
    """A long period of a thread (an op's own time, its later self time, or idle) inside which an op of another
    thread ended was waiting for that op, when either the thread resumed within TOLERANCE of its end (any thread),
    or the op was part of the work this thread handed to another thread (`handoff`: the gloo worker running the
    collective it issued, the autograd engine running its backward, a helper thread it joins) and it resumed within
    MAX_WAKEUP. (Another thread's op this thread handed nothing, a periodic background thread's, is no wait.) Inferred
    from that structure and the timing. The waiting time becomes the edge; the time from the awaited end to the
    period's end is a WAKEUP node on the waiting thread, as long as the measured latency. A period in which the
    thread also handed work over (the collective it then waited for) runs until the first such moment."""
    tops = sorted((it for it in g.items if it.kind == HOST_OP and it.measured and it.enclosing is None
                   and it.tid is not None and it.dur > 0), key=lambda it: (it.start + it.dur, it.id))
    ends = [it.start + it.dur for it in tops]
    periods = [x for x in g.items if x.kind in (HOST_OP, SELF_PART, DELAY) and x.measured and x.comm is None
               and x.tid is not None and x.stream is None and x.id not in chains.removed]
    for it in periods:
        if it.seg_end - it.start < MIN_WAIT:
            continue
        x = _latest_before(ends, tops, it.start + TOLERANCE, it.seg_end, lambda o, t=it.tid: o.tid != t)
        if x is None or it.seg_end - (x.start + x.dur) > TOLERANCE:
            x = _latest_before(ends, tops, it.start + TOLERANCE, it.seg_end,
                               lambda o, w=it.tid: served.holds(w, o))  # type: ignore[misc]
            if x is None or it.seg_end - (x.start + x.dur) > _max_wakeup(g, it, x):
                continue
        x_end = x.start + x.dur
        times = moments.get(it.tid, [])  # type: ignore[call-overload]
        k = bisect.bisect_right(times, it.start)
        wait_from = times[k] if k < len(times) and times[k] < x_end else it.start
        wake = chains.split(it, wait_from, WAKEUP)
        wake.start = min(x_end, wake.seg_end)
        wake.dur = wake.excl = wake.seg_end - wake.start
        wake.awaits.append((x.id, "thread_wait", True))
        # Collectives of the threads it handed work to that ended while it waited were waited for too (DDP's
        # buckets, all waited for at the end of backward): each gates the wake-up, whichever ends last.
        lo = bisect.bisect_left(ends, wait_from)
        for o in tops[lo:bisect.bisect_left(ends, x_end)]:
            if o.comm is not None and served.holds(it.tid, o) and o is not x:  # type: ignore[arg-type]
                wake.awaits.append((o.id, "thread_wait", True))
        if it.kind == DELAY and wait_from == it.start:  # the idle period was all waiting: only its wake-up is left
            chains.removed.add(it.id)
    chains.reset_starts()


def _max_wakeup(g: Graph, it: Item, x: Item) -> float:
    """How late a thread may resume after handed work `x` ended, for its period `it` to count as waiting for it. A
    collective it handed over, awaited in the issuing op's own time (a synchronous `c10d::broadcast_` that has not
    returned) or in time between ops (`work.wait()`, untraced, in `ProfilerStep#k [self]` or idle), is waited for
    however loaded the machine is: without a bound where the period began as the worker took the collective up (the
    thread did nothing traced from the hand-over to its resuming: 10 ms seen on 2 overloaded cores), else up to
    ISSUER_MAX_WAKEUP; an op's own first period (work of its own), MAX_WAKEUP."""
    if x.comm is None:
        return MAX_WAKEUP
    owner = g.by_id.get(it.part_of if it.part_of is not None else it.id)
    issuing = owner is not None and owner.name.startswith(_ISSUE_PREFIXES) and owner.start <= x.start
    if not issuing and it.kind not in (SELF_PART, DELAY):
        return MAX_WAKEUP
    return math.inf if it.start <= x.start + MAX_WAKEUP else ISSUER_MAX_WAKEUP


def _await_last_periods(g: Graph, chains: _Chains) -> None:
    """A thread waited for an op of another thread to end: the edge comes from the op's last period on its thread
    (the op may have been cut into periods after the wait was found)."""
    chains.reset_starts()
    for it in g.items:
        for n, (src, how, inferred) in enumerate(it.awaits):
            x = g.by_id[src]
            if how != "thread_wait" or x.tid is None:
                continue
            order, end = chains.ids[x.tid], x.start + x.dur
            k = bisect.bisect_left(chains.starts(x.tid), end) - 1
            while k >= 0 and order[k] in chains.removed:
                k -= 1
            if k >= 0 and order[k] != src and g.by_id[order[k]].start >= x.start:
                it.awaits[n] = (order[k], how, inferred)


def _name_untraced(g: Graph, chains: _Chains) -> None:
    """Idle time on a thread between its ops that no evidence says was waiting is code the profiler did not record
    (Python between ops, data loading): it stays a fixed duration, named for what it is. Idle time before a
    thread's first op that no hand-over explains stays an `[idle]` delay: the thread had not started working."""
    for order in chains.ids.values():
        started = False
        for i in order:
            it = g.by_id[i]
            if i in chains.removed or it.kind == THREAD_ROOT:
                continue
            if it.kind == DELAY and started:
                it.kind, it.name = UNTRACED, "[untraced]"
            started = True


class _Handed:
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

    def holds(self, by: int | str, op: Item) -> bool:
        """Whether `op` ran in work that thread `by` handed to op's thread."""
        spans = self.stretches.get((by, op.tid)) if op.tid is not None else None  # type: ignore[arg-type]
        if not spans:
            return False
        k = bisect.bisect_right(spans, (op.start, math.inf)) - 1
        return k >= 0 and spans[k][0] <= op.start < spans[k][1]


# Ops that hand work to another thread of the process: issuing a collective that a gloo worker runs.
_ISSUE_PREFIXES = ("c10d::",)


class _HandOverEvidence:
    """What says that a thread handed the work a woken thread then ran, beyond the timing (a thread that wakes up on
    its own, a periodic background thread, is handed nothing): the handing thread issued a collective since the
    worker went idle and the worker runs a collective; the worker runs backward functions of ops the handing thread
    ran forward (autograd sequence ids); or the worker's op reads a tensor the handing thread wrote (a collective
    queued while the worker was still busy with the previous one: the issuing op wrote its tensor)."""

    def __init__(self, g: Graph) -> None:
        self.issued: dict[int | str, tuple[list[float], list[Item]]] = {}  # thread -> its collective issues
        self.ops: dict[int | str, tuple[list[float], list[Item]]] = {}  # thread -> its host ops by start
        self.forward_tid: dict[int, int | str] = {}  # autograd sequence id -> the thread of its forward op
        self.writers: dict[tuple[int, int], list[Item]] = defaultdict(list)  # tensor -> the ops that wrote it
        per: dict[int | str, list[Item]] = defaultdict(list)
        issued: dict[int | str, list[Item]] = defaultdict(list)
        for it in sorted((x for x in g.items if x.kind == HOST_OP and x.tid is not None and x.measured),
                         key=lambda x: (x.start, x.id)):
            tid: int | str = it.tid  # type: ignore[assignment]
            per[tid].append(it)
            if it.name.startswith(_ISSUE_PREFIXES):
                issued[tid].append(it)
            h = it.host
            if h is None:
                continue
            if h.seq_id >= 0:
                self.forward_tid.setdefault(h.seq_id, tid)
            for _, tensor, storage, _, _ in h.output_tensors:
                self.writers[(tensor, storage)].append(it)
        self.ops = {tid: ([x.start for x in ops], ops) for tid, ops in per.items()}
        self.issued = {tid: ([x.start for x in ops], ops) for tid, ops in issued.items()}

    def shows(self, by: int | str, gap: Item, woken: Item) -> tuple[bool, Item | None]:
        """Whether thread `by` handed over the work that `woken` (the first period after the idle `gap` of its
        thread) begins, and the op of `by` that handed it over where the evidence names one (it ended by then)."""
        t = woken.start
        starts, ops = self.ops.get(woken.tid, ([], []))  # type: ignore[arg-type]
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
            if h.seq_id >= 0 and self.forward_tid.get(h.seq_id) == by and o.tid != by:
                return True, None  # the backward of an op `by` ran forward: `by` called backward()
            for _, tensor, storage, _, _ in h.input_tensors:
                wrote = [w for w in self.writers.get((tensor, storage), ()) if w.tid == by and w.start <= t]
                if wrote:  # reads what `by` wrote: handed over as data
                    w = max(wrote, key=lambda x: (x.start, x.id))  # an issuing op names the hand-over
                    return True, w if w.start + w.dur <= t and w.name.startswith(_ISSUE_PREFIXES) else None
        return False, None


def _handoffs(g: Graph, chains: _Chains, evidence: _HandOverEvidence, apply: bool) -> tuple[
        _Handed, dict[int | str, list[float]]]:
    """An idle gap on a worker thread ends when another thread hands it work (inferred). If that thread was running
    an op at that moment, the op is cut there and the gap becomes an edge from its first part; if it had just
    entered a wait (a zero-length blocking node while the gap was open, e.g. `backward()` handing the engine its
    first task), the gap becomes a WAKEUP node from that moment, after an edge from it. The main thread's gaps are
    not handoffs (Python work, data loading). Before a thread's first op, the thread was started (by the main
    thread's untraced code too); after it, the timing alone is no hand-over: the handing thread must show one
    (_HandOverEvidence), else the gap stays the woken thread's own (untraced) time. Returns the work each thread
    handed over, and thread -> the moments it did (sorted); with `apply` False nothing is changed."""
    handed = _Handed()
    moments: dict[int | str, list[float]] = defaultdict(list)
    firsts = {tid: next((g.by_id[i].start for i in order if g.by_id[i].kind not in (THREAD_ROOT, DELAY)), None)
              for tid, order in chains.ids.items()}
    timed = {t: s for t, s in firsts.items() if s is not None}
    if len(timed) < 2:
        return handed, moments
    main = min(timed, key=lambda t: (timed[t], -len(chains.ids[t]), str(t)))
    for tid, order in sorted(chains.ids.items(), key=lambda kv: str(kv[0])):
        if tid == main:
            continue
        started = False
        given: list[tuple[int | str, float, float | None]] = []  # (by, from, to: None = until the next hand-over)
        for pos, i in enumerate(list(order)):
            gap = g.by_id[i]
            if gap.kind != DELAY or pos + 1 >= len(order) or i in chains.removed:
                started = started or gap.kind not in (THREAD_ROOT, DELAY, WAKEUP)
                continue
            nxt = g.by_id[order[pos + 1]]
            found, moment, queued = None, nxt.start, None
            for t in [main, *(t for t in sorted(chains.ids, key=str) if t not in (tid, main))]:
                f = _handing(g, chains, t, gap, nxt.start, idle_hands=t == main)
                shown, issuer = evidence.shows(t, gap, nxt) if started else (f is not None, None)
                if not shown:
                    continue
                if (issuer is not None and issuer.start + issuer.dur <= gap.start
                        and nxt.start - gap.start <= MAX_WAKEUP):
                    # queued while the worker was still busy: handed over when the issuing op ended, not when the
                    # worker got to it (the handing thread's wait for it began then)
                    moment = issuer.start + issuer.dur
                    if f is None:  # the handing thread is long blocked by now (waiting for this very work)
                        queued = chains.last_period(issuer)
                if f is not None or queued is not None:
                    found = f
                    break
            if queued is not None:  # the worker took it up after its previous work: its idle time stays its own
                if queued.tid is not None:
                    moments[queued.tid].append(moment)
                    if not apply:
                        given.append((queued.tid, nxt.start, None))
                if apply:
                    nxt.awaits.append((queued.id, "handoff", True))
                continue
            if found is None:
                continue
            src, running = found
            if src.tid is not None:
                moments[src.tid].append(moment)
                # Work handed over with evidence (a collective, a backward pass) runs until the worker is handed
                # work again, across idle time of its own (the engine waiting inside the backward pass); a thread
                # merely started was handed its first stretch of work, up to its first idle time.
                given.append((src.tid, nxt.start, None if started else _stretch_end(g, order, pos + 1)))
            if not apply:
                continue
            if running:
                if src.seg_end - nxt.start >= 0.5 and nxt.start - src.start >= 0.5:
                    chains.split(src, nxt.start, SELF_PART if src.kind != RESUME else RESUME)
                nxt.awaits.append((src.id, "handoff", True))
                chains.removed.add(gap.id)
            else:  # the worker woke up after the handing thread began to wait: that latency is a wake-up
                gap.kind, gap.name = WAKEUP, "[wake-up]"
                gap.start = max(gap.start, src.seg_end if src.seg_end > src.start
                                else math.nextafter(src.start, math.inf))
                gap.dur = gap.excl = gap.seg_end - gap.start
                gap.awaits.append((src.id, "handoff", True))
                chains.reset_starts()
        if not apply:
            for k, (by, lo, hi) in enumerate(given):
                handed.add(by, tid, lo, hi if hi is not None else given[k + 1][1] if k + 1 < len(given) else math.inf)
    for times in moments.values():
        times.sort()
    handed.sort()
    return handed, moments


def _stretch_end(g: Graph, order: list[int], pos: int) -> float:
    """When the busy stretch of a thread that begins at order[pos] ends: at its next idle period (or never)."""
    for i in order[pos + 1:]:
        if g.by_id[i].kind == DELAY:
            return g.by_id[i].start
    return math.inf


def _handing(g: Graph, chains: _Chains, tid: int | str, gap: Item, t: float,
             idle_hands: bool = False) -> tuple[Item, bool] | None:
    """The period of thread `tid` that handed work to a thread whose idle `gap` ended at t: the op it was running
    then (True), or the blocking node it had entered while the gap was open, within MAX_WAKEUP (False). With
    `idle_hands` (the main thread), its untraced code (Python calling `backward()`, starting a thread) hands work
    over too; a worker's idle time is only waiting."""
    running = _executing(g, chains, tid, t, idle_hands)
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


def _executing(g: Graph, chains: _Chains, tid: int | str, t: float, idle: bool) -> Item | None:
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


def _stream_waits(g: Graph) -> None:
    """A GPU op that started later than its stream and its launch allowed waited for something: another stream's
    op that ended just before (inferred; cross-stream event waits often carry no ids), else idle (a DELAY)."""
    by_device: dict[int, list[Item]] = defaultdict(list)
    for it in g.items:
        if it.kind in GPU_KINDS:
            by_device[it.device or 0].append(it)
    index = {}
    for dev, ops in by_device.items():
        ops.sort(key=lambda it: (it.start + it.dur, it.id))
        index[dev] = ([it.start + it.dur for it in ops], ops)
    t0 = min((it.start for it in g.items if it.measured), default=0.0)
    for key, order in list(g.streams.items()):
        new_order: list[int] = []
        prev: Item | None = None
        for i in order:
            it = g.by_id[i]
            launch = g.by_id.get(it.launcher) if it.launcher is not None else None
            # A stream starts idle at the run's first instant: a first op with no launch record waited from there.
            ready = max(prev.start + prev.dur if prev else t0, launch.seg_end if launch else float("-inf"),
                        *(g.by_id[a].start + g.by_id[a].dur for a, how, _ in it.awaits if how == "event_wait"))
            if it.start - ready > TOLERANCE:
                ends, ops = index[key[0]]
                x = _latest_before(ends, ops, ready, it.start + TOLERANCE,
                                   lambda o, s=key[1]: (o.stream or 0) != s)
                idle_from = ready
                if x is not None:
                    x_end = x.start + x.dur
                    if it.start - x_end <= TOLERANCE:
                        it.awaits.append((x.id, "stream_wait", True))
                        idle_from = it.start
                    else:  # it waited for x, then for something no record shows: idle after x
                        idle_from = x_end
                if launch is not None and idle_from <= launch.start:
                    # a launch that returned at once (a zero-length node) starts where the idle time does: keep
                    # the idle node a hair later so its edge from the launch goes forward in the total order
                    idle_from = math.nextafter(launch.start, math.inf)
                if it.start - idle_from > TOLERANCE:
                    d = g.add(Item(id=0, kind=DELAY, name="[gpu idle]", start=idle_from, seg_end=it.start,
                                   measured=True, device=key[0], stream=key[1]))
                    d.dur = d.excl = it.start - idle_from
                    # the idle time starts once whatever made the op ready is done: its launch, an event waited
                    # on, or the op on another stream it waited for
                    if launch is not None:
                        d.awaits.append((launch.id, "launch", False))
                    d.awaits.extend(a for a in it.awaits if a[1] == "event_wait")
                    if x is not None and idle_from > ready:
                        d.awaits.append((x.id, "stream_wait", True))
                    new_order.append(d.id)
            new_order.append(i)
            prev = it
        g.streams[key] = new_order


class NoWaitEvidence:
    """Why delay periods that stayed fixed durations were not taken for waits: what ended elsewhere while they ran
    (indexed once, so the report can ask for every long delay of a large trace)."""

    def __init__(self, g: Graph) -> None:
        tops = sorted((o for o in g.items if o.kind == HOST_OP and o.measured and o.enclosing is None
                       and o.tid is not None), key=lambda o: (o.start + o.dur, o.id))
        self.tops = (tops, [o.start + o.dur for o in tops])
        gpu: dict[int | None, list[Item]] = defaultdict(list)
        for o in g.items:
            if o.kind in GPU_KINDS:
                gpu[o.device].append(o)
        self.gpu = {}
        for dev, ops in gpu.items():
            ops.sort(key=lambda o: (o.start + o.dur, o.id))
            self.gpu[dev] = (ops, [o.start + o.dur for o in ops])

    def of(self, it: Item) -> str:
        end = it.seg_end
        if it.stream is not None:  # idle on a GPU stream
            ops, ends = self.gpu.get(it.device, ([], []))
            last = _latest_before(ends, ops, it.start, end + TOLERANCE, lambda o: o.stream != it.stream)
            if last is None:
                return "no op on another stream of its device ended while the stream was idle"
            return (f"the last op on another stream to end ({last.name}, stream {last.stream}) ended "
                    f"{end - last.start - last.dur:.0f} us before the idle time did (> {TOLERANCE:.0f} us)")
        tops, ends = self.tops
        last = _latest_before(ends, tops, math.nextafter(it.start, math.inf), end, lambda o: o.tid != it.tid)
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
