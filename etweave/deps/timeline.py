"""Lookups of the measured timeline by end time, shared by the wait finders."""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable

from etweave.model import GPU_KINDS, Graph, Item


def gpu_ends(g: Graph) -> tuple[list[float], list[Item]]:
    return by_end(g.of_kinds(GPU_KINDS))


def by_end(items: list[Item]) -> tuple[list[float], list[Item]]:
    """The items' ends (start + dur) in (end, id) order, and the items in that order: sorted on (end, id, item)
    tuples (ids are unique: no item is ever compared), not on a key function called per item."""
    keyed = sorted([(it.start + it.dur, it.id, it) for it in items])  # (a comprehension: cheaper than attrgetters)
    return list(map(_FIRST, keyed)), list(map(_THIRD, keyed))


_FIRST, _THIRD = operator.itemgetter(0), operator.itemgetter(2)


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
