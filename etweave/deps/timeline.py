"""Lookups of the measured timeline by end time, shared by the wait finders."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from etweave.model import GPU_KINDS, Graph, Item


def gpu_ends(g: Graph) -> tuple[list[float], list[Item]]:
    ops = sorted(g.of_kinds(GPU_KINDS), key=lambda it: (it.start + it.dur, it.id))
    return [it.start + it.dur for it in ops], ops


def on_stream(stream: int | None) -> Callable[[Item], bool]:
    return lambda o: o.stream == stream


def off_thread(tid: int | str) -> Callable[[Item], bool]:
    return lambda o: o.tid != tid


def latest_before(ends: list[float], ops: list[Item], lo: float, hi: float,
                   ok: Callable[[Item], bool] | None = None) -> Item | None:
    """The item with the latest end in [lo, hi] (that `ok` accepts)."""
    k = bisect.bisect_right(ends, hi)
    while k > 0 and ends[k - 1] >= lo:
        k -= 1
        if ok is None or ok(ops[k]):
            return ops[k]
    return None
