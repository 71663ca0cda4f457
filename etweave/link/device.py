"""The Kineto runtime calls and GPU events that belong to the linked window, and what was left out, why."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from itertools import compress

import msgspec

from etweave.read.kineto import EventTable, KinetoTrace

_EXAMPLES = 5


class LeftOut(msgspec.Struct):
    count: int = 0
    examples: list[str] = msgspec.field(default_factory=list)

    def add_at(self, events: EventTable, i: int) -> None:
        self.count += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append(f"{events.name[i][:80]} @ {events.ts[i]}")

    def add_all(self, events: EventTable, indices: Iterable[int]) -> None:
        """Count these events; the first few are kept as examples (from the columns: nothing is decoded)."""
        indices = list(indices)
        for i in indices[:_EXAMPLES]:
            self.add_at(events, i)
        self.count += max(0, len(indices) - _EXAMPLES)


class DeviceSelection(msgspec.Struct):
    """The Kineto runtime calls and GPU events that belong to the linked window, and what was left out, why."""

    runtime: list[int]  # event indices, file order
    gpu: list[int]
    launcher_of: dict[int, int]  # GPU event index -> runtime event index
    gpu_input: int = 0
    runtime_input: int = 0
    left_out: dict[tuple[str, str], LeftOut] = msgspec.field(default_factory=dict)  # (kind, reason) -> what

    def leave_out_all(self, kind: str, reason: str, events: EventTable, indices: Sequence[int]) -> None:
        if indices:
            self.left_out.setdefault((kind, reason), LeftOut()).add_all(events, indices)


def select_device(kineto: KinetoTrace, window: tuple[float, float] | None) -> DeviceSelection:
    # Columns only: at a few GB of trace, decoding every event here again would cost more than the rest.
    events = kineto.events
    ts, dur, correlation = events.ts, events.dur, events.correlation
    runtime = events.runtime
    runtime_by_corr = {correlation[r]: r for r in runtime if correlation[r] >= 0}
    sel = DeviceSelection([], [], {}, gpu_input=len(events.gpu), runtime_input=len(events.runtime))
    lo, hi = window if window is not None else (float("-inf"), float("inf"))
    launcher_of, launcher = sel.launcher_of, runtime_by_corr.get
    launcherless: list[int] = []
    outside: list[int] = []
    gpu_end = hi
    for i in events.gpu:
        corr = correlation[i]
        r = launcher(corr) if corr >= 0 else None
        if r is None:
            launcherless.append(i)
        elif lo <= ts[r] <= hi:
            sel.gpu.append(i)
            launcher_of[i] = r
            end = ts[i] + dur[i]
            if end > gpu_end:
                gpu_end = end
        else:
            outside.append(i)
    # A GPU event with no launch record belongs to the window when it ran in it (its GPU tail included).
    sel.gpu += [i for i in launcherless if lo <= ts[i] <= gpu_end]
    outside += [i for i in launcherless if not lo <= ts[i] <= gpu_end]
    sel.gpu.sort()
    kept_runtime = set(launcher_of.values())
    kept = [r in kept_runtime or lo <= ts[r] <= hi for r in runtime]
    sel.runtime = list(compress(runtime, kept))
    sel.leave_out_all("device_ops", "outside_window", events, outside)
    sel.leave_out_all("runtime_calls", "outside_window", events, list(compress(runtime, map(operator.not_, kept))))
    return sel
