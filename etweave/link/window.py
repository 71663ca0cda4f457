"""Which part of a Kineto trace to convert (`--steps` / `--window`), and the linked window cut to it."""

from __future__ import annotations

import math
import re

import msgspec

from etweave.errors import BadInput
from etweave.read.kineto import KinetoTrace

_STEP = re.compile(r"ProfilerStep#(\d+)$")

Window = tuple[float, float]


class Selection(msgspec.Struct, frozen=True):
    """Which part of a Kineto trace to convert: `ProfilerStep#A` to `#B` inclusive, or a time window (µs)."""

    steps: tuple[int, int] | None = None
    window: Window | None = None  # an open side is +-inf

    @classmethod
    def parse(cls, steps: str | None = None, window: str | None = None) -> Selection | None:
        """From the CLI strings `A:B` (or `A`) and `START:END` (either side may be empty); None selects all."""
        if steps is not None and window is not None:
            raise BadInput("--steps", "give --steps or --window, not both")
        if steps is not None:
            a, sep, b = steps.partition(":")
            if not a.strip().isdecimal() or (sep and not b.strip().isdecimal()):
                raise BadInput("--steps", f"expected A:B with step numbers A <= B, got {steps!r}")
            first, last = int(a), int(b) if sep else int(a)
            if first > last:
                raise BadInput("--steps", f"first step {first} is after last step {last}")
            return cls(steps=(first, last))
        if window is not None:
            lo_s, sep, hi_s = window.partition(":")
            if not sep:
                raise BadInput("--window", f"expected START:END in µs (Kineto clock), got {window!r}")
            lo, hi = _bound(lo_s, -math.inf, window), _bound(hi_s, math.inf, window)
            if lo > hi:
                raise BadInput("--window", f"START {lo} is after END {hi}")
            return cls(window=(lo, hi))
        return None

    def resolve(self, kineto: KinetoTrace) -> Window:
        """The window in µs on the trace's clock; BadInput when the steps are not there or nothing is selected."""
        if self.steps is not None:
            spans: dict[int, Window] = {}
            for i in kineto.events.cpu:
                ev = kineto.events[i]
                m = _STEP.match(ev.name)
                if m:
                    n = int(m.group(1))
                    lo, hi = spans.get(n, (ev.ts, ev.ts + ev.dur))
                    spans[n] = (min(lo, ev.ts), max(hi, ev.ts + ev.dur))
            first, last = self.steps
            missing = [n for n in (first, last) if n not in spans]
            if missing:
                have = f"steps {min(spans)}..{max(spans)}" if spans else "no ProfilerStep# annotations"
                raise BadInput("--steps", f"ProfilerStep#{missing[0]} is not in the trace ({have})")
            return (spans[first][0], max(hi for n, (_, hi) in spans.items() if first <= n <= last))
        assert self.window is not None
        lo, hi = self.window
        events = kineto.events
        if not any(lo <= events.ts[i] <= hi for idx in (events.cpu, events.runtime, events.gpu) for i in idx):
            raise BadInput("--window", f"selects no cpu op, runtime call or GPU event ({lo}:{hi})")
        return self.window

def _bound(text: str, default: float, whole: str) -> float:
    if not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadInput("--window", f"expected START:END in µs (Kineto clock), got {whole!r}") from None
    if not math.isfinite(value):
        raise BadInput("--window", f"bounds must be finite numbers, got {whole!r}")
    return value


def restrict(linked: Window | None, selected: Window) -> Window:
    """With a host ET: the device window is the linked window cut to the selection."""
    if linked is None:
        return selected
    lo, hi = max(linked[0], selected[0]), min(linked[1], selected[1])
    if lo > hi:
        raise BadInput("--window", f"the selection does not overlap the window the host ET linked to "
                       f"({linked[0]}:{linked[1]})")
    return (lo, hi)
