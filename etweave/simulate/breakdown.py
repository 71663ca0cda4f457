"""Per rank and step: how its time splits into compute, communication hidden under compute, exposed
communication and idle, on the simulated timeline and on the measured one.

On one rank, within one step's span (`ProfilerStep#N`'s op and parts on that rank; a rank without steps: its whole
span), C is the union of the rank's compute intervals and M of its communication intervals:
  compute_us = |C|, communication_us = |M|, overlapped_us = |C and M|, exposed_communication_us = |M less C|
  (communication not overlapped by compute on the same rank), idle_us = span - |C or M|.
So compute_only_us + overlapped_us + exposed_communication_us + idle_us = span_us (compute_only_us = |C less M|),
and exposed_communication_us <= communication_us.
Communication: COMM_COLL/SEND/RECV nodes. Compute: the other nodes on a GPU stream when the rank has any (the
host only launches), else the other nodes on a CPU thread. Never compute: markers, and time that stands for no
op (kinds delay, wakeup, untraced; the `[rank start offset]`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.fidelity import NO_OP_KINDS, RANK_START_OFFSET
from etweave.nodes import is_marker_node
from etweave.simulate.engine import Replay, SimNode
from etweave.simulate.metrics import measured_window
from etweave.simulate.steps import step_of, step_ops

COLUMNS = ["timeline", "rank", "step", "start_us", "span_us", "compute_us", "communication_us", "overlapped_us",
           "exposed_communication_us", "idle_us", "compute_only_us"]


def _merged(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The union of (start, end) intervals clipped to [lo, hi], as disjoint sorted intervals."""
    out: list[tuple[int, int]] = []
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _role(nd: SimNode, gpu_rank: bool) -> str | None:
    if nd.type in COMM_NODE_TYPES:
        return "comm"
    if is_marker_node(nd.type, nd.kind) or nd.kind in NO_OP_KINDS or nd.name == RANK_START_OFFSET:
        return None
    if nd.resource is None:
        return None
    return "compute" if nd.resource.startswith("gpu") == gpu_rank else None


def split(compute: list[tuple[int, int]], comm: list[tuple[int, int]], lo: int, hi: int) -> dict[str, int]:
    """The numbers of one rank and step (see the module docstring); intervals in any order, clipped here."""
    c, m = _merged(compute, lo, hi), _merged(comm, lo, hi)
    busy = _length(_merged([*c, *m], lo, hi))
    both = _length(c) + _length(m) - busy
    return {"span_us": hi - lo, "compute_us": _length(c), "communication_us": _length(m), "overlapped_us": both,
            "exposed_communication_us": _length(m) - both, "idle_us": hi - lo - busy,
            "compute_only_us": _length(c) - both}


def breakdown(replay: Replay) -> list[dict[str, Any]]:
    """One record per timeline ("simulated", then "measured"), rank and step; times in µs after the earliest
    measured start over all ranks (the frame of `etweave simulate`'s summary)."""
    window = measured_window(replay)
    origin = window[0] if window else 0
    records: list[dict[str, Any]] = []
    for timeline in ("simulated", "measured"):
        if timeline == "measured" and window is None:
            continue
        for ri, rg in enumerate(replay.ranks):
            spans, intervals = _rank_periods(replay, ri, timeline, origin)
            steps: list[int | None] = [*sorted(k for k in spans if k is not None)]
            for step in steps or [None]:
                if step not in spans:
                    continue
                lo, hi = spans[step]
                records.append({"timeline": timeline, "rank": rg.rank, "step": step, "start_us": lo,
                                **split(intervals["compute"], intervals["comm"], lo, hi)})
    return records


def _rank_periods(replay: Replay, ri: int, timeline: str, origin: int
                  ) -> tuple[dict[int | None, list[int]], dict[str, list[tuple[int, int]]]]:
    """For rank index `ri` in one timeline: each step's span [lo, hi] (None: the whole rank), and the compute and
    communication intervals."""
    rg = replay.ranks[ri]
    gpu_rank = any(nd.resource and nd.resource.startswith("gpu") for nd in rg.nodes)
    ops = step_ops(rg.nodes)
    spans: dict[int | None, list[int]] = {}
    intervals: dict[str, list[tuple[int, int]]] = {"compute": [], "comm": []}
    for i, nd in enumerate(rg.nodes):
        period = _period(replay, ri, i, timeline, origin)
        if period is None:
            continue
        s, e = period
        role = _role(nd, gpu_rank)
        if role is not None:
            intervals[role].append((s, e))
        if nd.name == RANK_START_OFFSET or is_marker_node(nd.type, nd.kind):
            continue
        for key in {step_of(nd, ops), None} if ops else {None}:
            b = spans.setdefault(key, [s, e])
            b[0], b[1] = min(b[0], s), max(b[1], e)
    return spans, intervals


def _period(replay: Replay, ri: int, i: int, timeline: str, origin: int) -> tuple[int, int] | None:
    """Node i's (start, end) in `timeline`: simulated from issue (a collective holds its stream while it waits for
    its peers, as measured), measured after `origin`; None when it has none (never ran, not measured)."""
    if timeline == "simulated":
        s, e = replay.issue[ri][i], replay.end[ri][i]
        return (s, e) if e >= 0 else None  # e < 0: a deadlocked replay
    nd = replay.ranks[ri].nodes[i]
    if not nd.measured_start:
        return None
    return nd.measured_start - origin, nd.measured_start - origin + nd.measured_duration
