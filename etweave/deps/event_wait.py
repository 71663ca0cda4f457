"""Evidence `event_wait`: cudaStreamWaitEvent. The finders record on the first op of the waiting stream the op the
event was recorded after (run by the waits stage, whose stream waits build on them); the source gives their edges."""

from __future__ import annotations

import bisect
import operator
from collections import defaultdict

from etweave.deps.awaited import awaited
from etweave.deps.cuda_sync import SyncRecords
from etweave.deps.evidence import WAIT_TOLERANCE as TOLERANCE
from etweave.deps.evidence import Evidence
from etweave.model import GPU_KINDS, RUNTIME_KIND, Await, Edge, Graph, Item


def event_wait(g: Graph) -> list[Edge]:
    """cudaStreamWaitEvent: the first op on the waiting stream after the op the event was recorded after (recorded
    by a `Stream Wait Event` record; inferred from the launch order where there is none)."""
    return awaited(g, Evidence.EVENT_WAIT)


def recorded_event_waits(g: Graph, records: SyncRecords) -> None:
    """cudaStreamWaitEvent with its `Stream Wait Event` record: the first op enqueued on the waiting stream after
    the call waits for the op the event was recorded after (recorded evidence)."""
    for ev in g.sync_events:
        if ev.kind != "Stream Wait Event":
            continue
        awaited = records.recorded_op(ev)
        stream = ev.stream
        call = records.runtime.get(ev.correlation or -1)
        if awaited is None or call is None or stream is None or stream < 0:
            continue
        waiter = records.first_launched_after(ev.device, stream, call.start)
        if waiter is not None and waiter is not awaited and awaited.start <= waiter.start:
            waiter.wait_for(Await(awaited.id, Evidence.EVENT_WAIT, False))


def unrecorded_event_waits(g: Graph, records: SyncRecords) -> None:
    """cudaStreamWaitEvent with no `Stream Wait Event` record (most traces): the stream of the next GPU op the
    calling thread launches waits for the event, which was recorded after the last op enqueued on another stream
    before the call (`work.wait()` after a NCCL collective: the compute stream waits for the collective's kernel;
    before one: the NCCL stream waits for its input). Inferred, and kept only where the timeline agrees (the awaited
    op ended before the waiting op started)."""
    runtime = g.of_kinds(RUNTIME_KIND)
    # (told per distinct name; the calls of other names left out in C: most calls)
    waits = {n for n in {it.name for it in runtime} if n.endswith("StreamWaitEvent")}
    calls = sorted([it for it in runtime if it.name in waits and records.of(it) is None], key=_START_ID)
    if not calls:
        return
    launches = _launches_by_thread(g)
    times = {tid: [t for t, _ in seq] for tid, seq in launches.items()}
    done: set[tuple[int, int]] = set()
    for call in calls:
        if call.tid is None:  # launched nothing a thread's launches show
            continue
        seq = launches.get(call.tid, [])
        k = bisect.bisect_right(times.get(call.tid, []), call.start)
        if k >= len(seq):
            continue
        waiter = seq[k][1]
        awaited = _event_recorded_after(seq, k, waiter)
        if awaited is None or (awaited.id, waiter.id) in done:
            continue
        if awaited.start + awaited.dur <= waiter.start + TOLERANCE and awaited.start < waiter.start:
            waiter.wait_for(Await(awaited.id, Evidence.EVENT_WAIT, True))
            done.add((awaited.id, waiter.id))


_START_ID = operator.attrgetter("start", "id")


def _launches_by_thread(g: Graph) -> dict[int | str, list[tuple[float, Item]]]:
    """thread -> (launch time, GPU op) of every GPU op its runtime calls launched, in launch order."""
    keyed: dict[int | str, list[tuple[float, int, Item]]] = defaultdict(list)
    by_id = g.by_id
    for it in g.of_kinds(GPU_KINDS):
        if it.launcher is not None:
            call = by_id[it.launcher]
            if call.tid is not None:
                keyed[call.tid].append((call.start, it.id, it))
    launches: dict[int | str, list[tuple[float, Item]]] = {}
    for tid, seq in keyed.items():
        seq.sort(key=_TIME_ID)  # (launch time, id): ids are unique, the items never compared
        launches[tid] = [(t, it) for t, _, it in seq]
    return launches


_TIME_ID = operator.itemgetter(0, 1)


def _event_recorded_after(seq: list[tuple[float, Item]], k: int, waiter: Item) -> Item | None:
    """The op an unrecorded event waited on by `waiter` (the k-th launch of its thread) stands for: the last op
    launched before it on another stream of its device. Earlier launches are walked back, not copied: one call is
    O(its reach)."""
    earlier = (seq[j][1] for j in range(k - 1, -1, -1))
    awaited = next((op for op in earlier if op.stream != waiter.stream and op.device == waiter.device), None)
    if awaited is not None and awaited.start + awaited.dur > waiter.start + TOLERANCE:
        # The waiter started before that op ended: the event was recorded before it was enqueued, after an
        # earlier op of the same stream (back-to-back NCCL kernels, then work.wait() for the first).
        awaited = next((seq[j][1] for j in range(k - 1, -1, -1) if seq[j][1].stream == awaited.stream
                        and seq[j][1].device == waiter.device
                        and seq[j][1].start + seq[j][1].dur <= waiter.start + TOLERANCE), None)
    return awaited
