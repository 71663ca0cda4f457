"""Kineto's `cuda_sync` records, indexed for the wait finders (`sync`, `event_wait`)."""

from __future__ import annotations

import bisect
import functools
import operator
from collections import defaultdict

from etweave.model import GPU_KINDS, RUNTIME_KIND, Graph, Item, SyncRecord

_TIME_ID = operator.itemgetter(0, 1)


class SyncRecords:
    """Kineto `cuda_sync` events (when the profiler recorded them): which stream a sync call waited on, and which
    GPU op a recorded CUDA event stands for (the last op enqueued on its stream before cudaEventRecord)."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.by_call: dict[int, SyncRecord] = {}  # runtime call correlation -> its cuda_sync record
        for ev in g.sync_events:
            if ev.correlation is not None:
                self.by_call[ev.correlation] = ev

    # (the indexes below are read only through a record: built on first use, never on a trace without records)
    @functools.cached_property
    def runtime(self) -> dict[int, Item]:
        """correlation -> runtime item."""
        return {it.correlation: it for it in self.g.of_kinds(RUNTIME_KIND) if it.correlation is not None}

    @functools.cached_property
    def launched(self) -> dict[tuple[int, int], tuple[list[float], list[Item]]]:
        """per (device, stream): GPU ops in launch order, with their launch times."""
        g = self.g
        per: dict[tuple[int, int], list[tuple[float, int, Item]]] = defaultdict(list)
        for it in g.of_kinds(GPU_KINDS):
            if it.launcher is not None:
                per[(it.device or 0, it.stream or 0)].append((g.by_id[it.launcher].start, it.id, it))
        launched = {}
        for key, launches in per.items():
            launches.sort(key=_TIME_ID)  # (launch time, id): ids are unique, the items never compared
            launched[key] = ([t for t, _, _ in launches], [it for _, _, it in launches])
        return launched

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
