"""What ASTRA-sim's single slots serialize: work of one rank that really ran at once (docs/FACTS.md §A2).

ASTRA-sim runs at most one `is_cpu_op` node per NPU (all CPU threads share the slot), one GPU-compute node (all
streams share it) and one comm node (collectives and sends; receives take none). Work that ran concurrently on two
threads, two streams, or as two collectives in flight therefore runs one after the other there. etweave writes such
work as it ran — each thread and stream its own chain, CPU work as CPU ops, communication types only on real
communication — because every other encoding the single slot would time "right" misstates what ran (docs/FACTS.md §A2,
README "What ASTRA-sim computes"). The audit report counts what is left to that serialization here, per slot
class: how long two or more of its nodes really ran at once, and how many nodes did.
"""

from __future__ import annotations

from collections.abc import Iterable

from etweave.chakra import schema
from etweave.model import Graph, Item
from etweave.nodes import is_marker, on_gpu

SLOT_CLASSES = ("cpu", "gpu", "comm")


def slot_class(it: Item) -> str | None:
    """The ASTRA-sim slot the item's node takes (the rule of etweave.simulate.astra, on items): None = no slot."""
    if is_marker(it):
        return None  # zero-duration roots: they hold nothing
    if it.comm is not None:  # by node type, whatever its stream
        return None if it.comm.node_type == schema.COMM_RECV_NODE else "comm"
    return "gpu" if on_gpu(it) else "cpu"


def overlap_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Time during which two or more of the intervals were open at once."""
    starts, ends = _nonempty(intervals)
    return _overlap(starts, ends)


def overlapping_count(intervals: Iterable[tuple[float, float]]) -> int:
    """How many of the intervals share time with another one."""
    starts, ends = _nonempty(intervals)
    return _overlapping(starts, ends)


def _nonempty(intervals: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The intervals that hold time, as their starts and their ends (two lists, not a tuple each)."""
    starts: list[float] = []
    ends: list[float] = []
    for s, e in intervals:
        if e > s:
            starts.append(s)
            ends.append(e)
    return starts, ends


def _overlap(starts: list[float], ends: list[float]) -> float:
    """`overlap_us` of nonempty intervals: a sweep over the starts and the ends, each sorted (at one instant, ends
    before starts)."""
    starts, ends = sorted(starts), sorted(ends)
    n = len(starts)
    open_now, last, total = 0, 0.0, 0.0
    i = j = 0
    while j < n:  # every start comes before the last end
        if i < n and starts[i] < ends[j]:
            t = starts[i]
            i += 1
            step = 1
        else:
            t = ends[j]
            j += 1
            step = -1
        if open_now >= 2:
            total += t - last
        open_now += step
        last = t
    return total


def _overlapping(starts: list[float], ends: list[float]) -> int:
    """`overlapping_count` of nonempty intervals."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    count, reach = 0, float("-inf")  # reach: the latest end among the spans before this one
    for k, x in enumerate(order):
        s, e = starts[x], ends[x]
        # sorted by start: a span meets an earlier one iff the earlier ends reach past its start, and a later one
        # iff the next span starts before it ends
        if reach > s or (k + 1 < len(order) and starts[order[k + 1]] < e):
            count += 1
        reach = max(reach, e)
    return count


def _measured_span(it: Item) -> tuple[float, float]:
    if it.comm is not None:  # a comm node holds its slot from its start until the collective ended, waits included
        return round(it.start), round(it.start) + round(it.dur)  # as measured_duration_micros
    return round(it.start), round(it.seg_end)  # the node's own period, as start_time_micros/duration_micros


def serialized(g: Graph) -> dict[str, dict[str, int]]:
    """Per slot class: `overlap_micros` (time two or more of its nodes really ran at once) and `nodes` (how many
    of its nodes ran while another one of the class did). Measured nodes only."""
    starts: dict[str, list[float]] = {c: [] for c in SLOT_CLASSES}
    ends: dict[str, list[float]] = {c: [] for c in SLOT_CLASSES}
    for it in g.items:
        c = slot_class(it)
        if c is not None and it.start > 0:
            s, e = _measured_span(it)
            if e > s:
                starts[c].append(s)
                ends[c].append(e)
    return {c: {"overlap_micros": round(_overlap(starts[c], ends[c])), "nodes": _overlapping(starts[c], ends[c])}
            for c in SLOT_CLASSES}
