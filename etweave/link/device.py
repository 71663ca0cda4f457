"""The Kineto runtime calls and GPU events that belong to the linked window, and what was left out, why."""

from __future__ import annotations

from dataclasses import dataclass, field

from etweave.read.kineto import EventTable, KinetoTrace


@dataclass(slots=True)
class LeftOut:
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add_at(self, events: EventTable, i: int) -> None:
        self.count += 1
        if len(self.examples) < 5:  # decode and format only the examples kept: there can be millions left out
            ev = events[i]
            self.examples.append(f"{ev.name[:80]} @ {ev.ts}")


@dataclass(slots=True)
class DeviceSelection:
    """The Kineto runtime calls and GPU events that belong to the linked window, and what was left out, why."""

    runtime: list[int]  # event indices, file order
    gpu: list[int]
    launcher_of: dict[int, int]  # GPU event index -> runtime event index
    gpu_input: int = 0
    runtime_input: int = 0
    left_out: dict[tuple[str, str], LeftOut] = field(default_factory=dict)  # (kind, reason) -> what

    def leave_out(self, kind: str, reason: str, events: EventTable, i: int) -> None:
        self.left_out.setdefault((kind, reason), LeftOut()).add_at(events, i)


def select_device(kineto: KinetoTrace, window: tuple[float, float] | None) -> DeviceSelection:
    # Columns only: at a few GB of trace, decoding every event here again would cost more than the rest.
    events = kineto.events
    ts, correlation = events.ts, events.correlation
    runtime_by_corr = {correlation[r]: r for r in events.runtime if correlation[r] >= 0}
    sel = DeviceSelection([], [], {}, gpu_input=len(events.gpu), runtime_input=len(events.runtime))
    lo, hi = window if window is not None else (float("-inf"), float("inf"))
    kept_runtime: set[int] = set()
    launcherless: list[int] = []
    gpu_end = hi
    for i in events.gpu:
        corr = correlation[i]
        r = runtime_by_corr.get(corr) if corr >= 0 else None
        if r is None:
            launcherless.append(i)
        elif lo <= ts[r] <= hi:
            sel.gpu.append(i)
            sel.launcher_of[i] = r
            kept_runtime.add(r)
            gpu_end = max(gpu_end, ts[i] + events[i].dur)
        else:
            sel.leave_out("device_ops", "outside_window", events, i)
    # A GPU event with no launch record belongs to the window when it ran in it (its GPU tail included).
    for i in launcherless:
        if lo <= ts[i] <= gpu_end:
            sel.gpu.append(i)
        else:
            sel.leave_out("device_ops", "outside_window", events, i)
    sel.gpu.sort()
    for r in events.runtime:
        if r in kept_runtime or lo <= ts[r] <= hi:
            sel.runtime.append(r)
        else:
            sel.leave_out("runtime_calls", "outside_window", events, r)
    return sel
