"""Evidence `sync`: a blocking CUDA call (stream/device/event sync, synchronous copy) resumed after the GPU op it
waited for (recorded). The finder says which call waited for which op (run by the waits stage, which cuts the
waiting time out of the call); the source gives the edges."""

from __future__ import annotations

from collections import defaultdict

from etweave.deps.awaited import awaited
from etweave.deps.cuda_sync import SyncRecords
from etweave.deps.evidence import WAIT_TOLERANCE as TOLERANCE
from etweave.deps.evidence import Evidence
from etweave.deps.timeline import gpu_ends, latest_before, on_stream
from etweave.model import MEMCPY, RUNTIME_KIND, Edge, Graph, Item

_SYNC_WORDS = ("Synchronize",)
_COPY_PREFIXES = ("cudaMemcpy", "hipMemcpy", "cuMemcpy")
_MEMCPY = frozenset({MEMCPY})


def sync(g: Graph) -> list[Edge]:
    """A blocking CUDA call (stream/device/event sync, synchronous copy) resumed after the GPU op it waited for."""
    return awaited(g, Evidence.SYNC)


def find_blocking_calls(g: Graph, records: SyncRecords) -> list[tuple[Item, Item]]:
    """(call, GPU op it waited for): cudaStreamSynchronize & co., and copies that ran inside their call, waited for
    GPU work that ended after they began (recorded). A `cuda_sync` record names the stream or event waited on;
    without one, the GPU op that ended last during the call is what it waited for."""
    calls = g.of_kinds(RUNTIME_KIND)
    # (classified per distinct name; the calls of neither kind left out in C: most calls)
    names = {it.name for it in calls}
    sync_names = {n for n in names if any(w in n for w in _SYNC_WORDS)}
    copy_names = {n for n in names if n.startswith(_COPY_PREFIXES)}
    blocking = sync_names | copy_names
    if not blocking:
        return []
    # (each index only where a call of its kind was made: most traces make copies and no sync call, or none)
    ends, ops = gpu_ends(g) if sync_names else ([], [])
    launched: dict[int, list[Item]] = defaultdict(list)
    for it in g.of_kinds(_MEMCPY) if copy_names else ():  # (a copy waits for its own copies alone)
        if it.launcher is not None:
            launched[it.launcher].append(it)
    found: list[tuple[Item, Item]] = []
    for it in [it for it in calls if it.name in blocking]:
        end = it.start + it.dur
        awaited_op: Item | None = None
        if it.name in sync_names:
            awaited_op = _synced(it, records, ends, ops)
        elif it.name.startswith(_COPY_PREFIXES):
            # A synchronous copy runs inside its call. A pageable one returns once the last chunk is staged,
            # a little before the DMA ends: the call covered most of the copy, so it waited for it.
            own = [x for x in launched.get(it.id, ()) if x.kind == MEMCPY and x.dur > 0]
            awaited_op = next((x for x in own if x.start <= end and (x.start + x.dur <= end + TOLERANCE
                                                                     or end - x.start >= 0.5 * x.dur)), None)
        if awaited_op is not None and awaited_op.start + awaited_op.dur > it.start:
            found.append((it, awaited_op))
    return found


def _synced(it: Item, records: SyncRecords, ends: list[float], ops: list[Item]) -> Item | None:
    """The GPU op a sync call waited for: its record's event or stream, else what ended last during the call."""
    end = it.start + it.dur
    record = records.of(it)
    kind = record.kind if record is not None else None
    if record is not None and kind == "Event Sync":
        awaited_op = records.recorded_op(record)
        if awaited_op is not None and not it.start <= awaited_op.start + awaited_op.dur <= end + TOLERANCE:
            awaited_op = None
        return awaited_op
    if record is not None and kind == "Stream Sync" and (record.stream or -1) >= 0:
        return latest_before(ends, ops, it.start, end + TOLERANCE, on_stream(record.stream))
    return latest_before(ends, ops, it.start, end + TOLERANCE)
