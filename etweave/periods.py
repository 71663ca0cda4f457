"""The periods of each CPU thread while the waits stage cuts them: thread chains with their period starts, kept
sorted (for lookups by time) while periods are split, moved and removed."""

from __future__ import annotations

import bisect
import itertools
import operator

from etweave.model import ASSEMBLED_KINDS, DELAY, RESUME, WAKEUP, Graph, Item


class Chains:
    """Thread chains with their period starts, kept sorted while periods are split."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.ids: dict[int | str, list[int]] = {tid: list(order) for tid, order in g.threads.items()}
        self.removed: set[int] = set()
        # Period starts per thread, parallel to `ids`: built on first use (by the handoff finders) and kept in step by
        # split, set_start and move_start, so lookups are O(log n) instead of a rebuild per call.
        self._starts: dict[int | str, list[float]] = {}

    def starts(self, tid: int | str) -> list[float]:
        s = self._starts.get(tid)
        if s is None:
            by_id = self.g.by_id
            s = self._starts[tid] = [by_id[i].start for i in self.ids[tid]]  # (cheaper than attrgetters in C)
        return s

    def set_start(self, it: Item, start: float) -> None:
        """Move the start of period `it`, keeping its thread's period starts in step where they are kept (its place
        found by its start, not a scan): what a rebuild would give, without one."""
        starts = self._starts.get(thread_of(it))
        if starts is not None:
            starts[self._position(it, starts)] = start
        it.start = start

    def move_start(self, it: Item, pos: int, start: float) -> None:
        """Move the start of period `it`, at `pos` of its thread, keeping that thread's period starts in step (what a
        rebuild would give, without one per moved period)."""
        it.start = start
        starts = self._starts.get(thread_of(it))
        if starts is not None:
            starts[pos] = start

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
        order = self.ids[thread_of(it)]
        starts = self._starts.get(thread_of(it))
        pos = self._position(it, starts)
        order.insert(pos + 1, tail.id)
        if starts is not None:
            starts.insert(pos + 1, at)
        return tail

    def _position(self, it: Item, starts: list[float] | None) -> int:
        """Where period `it` is on its thread: found by its start in the period starts where they are kept, else
        by a scan of the chain."""
        order = self.ids[thread_of(it)]
        pos = -1
        if starts is not None:
            pos = bisect.bisect_left(starts, it.start)
            while pos < len(order) and order[pos] != it.id and starts[pos] == it.start:
                pos += 1
        if not 0 <= pos < len(order) or order[pos] != it.id:
            pos = order.index(it.id)
        return pos

    def last_period(self, op: Item) -> Item:
        """The last period of `op` still on its thread (an op may have been cut into periods)."""
        tid = thread_of(op)
        order = self.ids[tid]
        end = op.start + op.dur
        starts = self._starts.get(tid)
        # in the period starts where kept, else on the chain by each period's start: a few lookups, not a rebuild of
        # the thread's starts (the same place)
        k = (bisect.bisect_left(starts, end) if starts is not None
             else bisect.bisect_left(order, end, key=lambda i: self.g.by_id[i].start)) - 1
        while k >= 0 and (order[k] in self.removed or self.g.by_id[order[k]].start < op.start):
            k -= 1
        return self.g.by_id[order[k]] if k >= 0 and self.g.by_id[order[k]].start >= op.start else op

    def store(self) -> None:
        removed = self.removed.__contains__  # (the filters run in C)
        for tid, order in self.ids.items():
            self.g.threads[tid] = list(itertools.filterfalse(removed, order))
        if self.removed:
            self.g.items = _without(self.g.items, self.removed)
            by_id = self.g.by_id
            if any(by_id[i].kind in ASSEMBLED_KINDS for i in self.removed):  # (only idle gaps are, so far)
                self.g.kind_index.clear()  # `Graph.of_kinds` would list an item that is gone
            for i in self.removed:
                del by_id[i]


_ID = operator.attrgetter("id")


def _without(items: list[Item], removed: set[int]) -> list[Item]:
    """The items but those of the removed ids, in order: found by bisection where the items are in id order (a
    graph's always are), the rest copied in slices, not a test per item; else by a pass."""
    positions = sorted(bisect.bisect_left(items, i, key=_ID) for i in removed)
    if not all(p < len(items) and items[p].id == i for p, i in zip(positions, sorted(removed), strict=True)):
        return list(itertools.compress(items, map(operator.not_, map(removed.__contains__, map(_ID, items)))))
    kept: list[Item] = []
    prev = 0
    for p in positions:
        kept.extend(items[prev:p])
        prev = p + 1
    kept.extend(items[prev:])
    return kept


def thread_of(it: Item) -> int | str:
    """The thread of a period on a thread's chain (every one has one)."""
    assert it.tid is not None, f"{it.name} ({it.id}) is on no thread"
    return it.tid
