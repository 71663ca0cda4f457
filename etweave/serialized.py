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

import itertools
import math
import operator
from collections.abc import Iterable, Sequence

from etweave.chakra import schema
from etweave.model import GPU_KINDS, HOST_OP, PROCESS_ROOT, THREAD_ROOT, Graph, Item
from etweave.nodes import Rounded, is_marker, on_gpu
from etweave.read.host_et import PG_INIT_NAME

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


def _overlap(starts: Sequence[float], ends: Sequence[float]) -> float:
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


def _overlapping(starts: Sequence[float], ends: Sequence[float]) -> int:
    """`overlapping_count` of nonempty intervals."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    s_sorted = list(map(starts.__getitem__, order))
    count, reach = 0, -math.inf  # reach: the latest end among the spans before this one
    for s, e, next_start in zip(s_sorted, map(ends.__getitem__, order), [*s_sorted[1:], math.inf], strict=False):
        # sorted by start: a span meets an earlier one iff the earlier ends reach past its start, and a later one
        # iff the next span starts before it ends
        if reach > s or next_start < e:
            count += 1
        if e > reach:  # (max(reach, e))
            reach = e
    return count


def _measured_span(it: Item) -> tuple[float, float]:
    if it.comm is not None:  # a comm node holds its slot from its start until the collective ended, waits included
        return round(it.start), round(it.start) + round(it.dur)  # as measured_duration_micros
    return round(it.start), round(it.seg_end)  # the node's own period, as start_time_micros/duration_micros




def serialized(g: Graph, rounded: Rounded | None = None) -> dict[str, dict[str, int]]:
    """Per slot class: `overlap_micros` (time two or more of its nodes really ran at once) and `nodes` (how many
    of its nodes ran while another one of the class did). Measured nodes only. (`rounded`: the items' times, when
    made already.)"""
    spans: dict[str | None, tuple[list[int], list[int]]] = {c: ([], []) for c in SLOT_CLASSES}  # starts, lengths
    cpu, gpu, comm = spans["cpu"], spans["gpu"], spans["comm"]
    roots, gpu_kinds, recv = _ROOT_KINDS, GPU_KINDS, schema.COMM_RECV_NODE
    starts, lengths = rounded or Rounded.of(g.items)
    for it, s, d in zip(g.items, starts, lengths, strict=True):  # slot_class and _measured_span, inline: one pass
        if not it.start > 0:
            continue
        kind = it.kind
        if kind in roots or (kind == HOST_OP and it.name == PG_INIT_NAME):
            continue
        c = it.comm
        if c is not None:
            if c.node_type == recv:
                continue
            to, d = comm, round(it.dur)
        else:
            to = gpu if kind in gpu_kinds or it.stream is not None else cpu
        if d > 0:
            to[0].append(s)
            to[1].append(d)
    return {c: _serialized_of(*spans[c]) for c in SLOT_CLASSES}


_ROOT_KINDS = frozenset({PROCESS_ROOT, THREAD_ROOT})


def _serialized_of(starts: list[int], lengths: list[int]) -> dict[str, int]:
    """One class's counts, of its spans' starts and lengths: `_overlap` and `_overlapping` in whole-list passes over
    the spans sorted once, on times less the earliest start (Kineto's µs since the epoch are ints of two digits to
    Python, each step a slow one; small ints are fast, and exact)."""
    if not starts:
        return {"overlap_micros": 0, "nodes": 0}
    order = sorted(range(len(starts)), key=starts.__getitem__)
    starts = list(map(starts.__getitem__, order))  # (sorted)
    lengths = list(map(lengths.__getitem__, order))
    del order  # (its ints: 5 MB of the audit's peak on a trace of 224k items)
    if all(map(operator.le, map(operator.add, starts, lengths), itertools.islice(starts, 1, None))):
        # each span ends before the next one starts: none meets another (the usual case: the sweeps below, and
        # their lists, skipped)
        return {"overlap_micros": 0, "nodes": 0}
    base = starts[0]
    s = list(map(operator.sub, starts, itertools.repeat(base)))
    e = list(map(operator.add, s, lengths))
    del starts, lengths
    # Sorted by start, span k meets an earlier one iff the latest end before it (`reach`) passes its start, and a
    # later one iff the next span starts before it ends (`_overlapping`). Two or more are open exactly in the
    # union of [s_k, min(e_k, reach_k)) (the latest-starting open span and an earlier one reaching past it), and
    # a union of spans sorted by start measures as each one's part beyond the ends before it (`_overlap`).
    first = s[0]  # (a reach before the first span: no span ends before it)
    reach = list(itertools.accumulate(e[:-1], max, initial=first))
    nodes = sum(map(operator.or_, map(operator.gt, reach, s), map(operator.lt, [*s[1:], math.inf], e)))
    both = list(map(min, e, reach))
    covered = itertools.accumulate(both[:-1], max, initial=first)
    overlap = sum(map(max, itertools.repeat(0), map(operator.sub, both, map(max, s, covered))))
    return {"overlap_micros": round(overlap), "nodes": nodes}
