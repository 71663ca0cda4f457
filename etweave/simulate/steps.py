"""Step times of a replay beside the measured ones: `ProfilerStep#N` boundaries where the trace has them.

A step of one rank runs from its `ProfilerStep#N` op's start to the end of its last part (`[self]` node); a step of
the run from the earliest start to the latest end of that step over the ranks that have it. Measured and simulated
times are in the frame of `metrics.summarize` (µs after the earliest measured start over all ranks). Without steps
the whole span is the one "step" (`step` None).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from etweave.simulate.engine import Replay, SimNode
from etweave.simulate.metrics import measured_window
from etweave.stats import percent

PART_KINDS = frozenset({"self_part", "resume"})  # node kinds that are later periods of an op (attr part_of)
STEP_NAME = re.compile(r"ProfilerStep#(\d+)$")


def step_ops(nodes: Sequence[SimNode]) -> dict[int, int]:
    """Node id of each `ProfilerStep#N` op -> N."""
    out = {}
    for nd in nodes:
        if "ProfilerStep#" in nd.name:  # (a test in C before the regex: this runs for every node)
            m = STEP_NAME.match(nd.name)
            if m and nd.kind not in PART_KINDS:
                out[nd.id] = int(m.group(1))
    return out


def step_of(node: SimNode, ops: dict[int, int]) -> int | None:
    """The step whose op `node` is (or is a part of), else None."""
    return ops.get(node.part_of if node.kind in PART_KINDS else node.id)


def step_bounds(nodes: Sequence[SimNode]) -> dict[int, tuple[int, int]]:
    """Step N -> (measured start, measured end) of its op and parts on one rank (measured nodes only)."""
    ops = step_ops(nodes)
    bounds: dict[int, tuple[int, int]] = {}
    for nd in nodes:
        step = step_of(nd, ops)
        if step is None or not nd.measured_start:
            continue
        lo, hi = bounds.get(step, (nd.measured_start, nd.measured_start))
        bounds[step] = (min(lo, nd.measured_start), max(hi, nd.measured_start + nd.measured_duration))
    return bounds


def step_times(replay: Replay) -> dict[str, Any]:
    """{"steps": [{step, measured_us, simulated_us, error_pct, measured_start_us, simulated_start_us}],
    "span": the same over the recorded steps together (or the whole run without steps)}."""
    return step_times_in(replay, measured_window(replay))


def step_times_in(replay: Replay, window: tuple[int, int] | None) -> dict[str, Any]:
    """`step_times`, the replay's `metrics.measured_window` given by a caller that has it (`etweave simulate`:
    from the summary; a pass over every node less)."""
    origin = window[0] if window else 0
    # step -> [measured lo, measured hi, simulated lo, simulated hi]
    bounds: dict[int, list[int]] = {}
    for ri, rg in enumerate(replay.ranks):
        ops = step_ops(rg.nodes)
        if not ops:
            continue  # no node of the rank is in a step
        starts, ends = replay.start[ri], replay.end[ri]
        for i, nd in enumerate(rg.nodes):
            step = ops.get(nd.part_of if nd.kind in PART_KINDS else nd.id)  # step_of, written out: per node
            if step is None:
                continue
            b = bounds.setdefault(step, [1 << 62, -(1 << 62), 1 << 62, -(1 << 62)])
            if nd.measured_start:
                b[0] = min(b[0], nd.measured_start - origin)
                b[1] = max(b[1], nd.measured_start + nd.measured_duration - origin)
            b[2] = min(b[2], starts[i])
            b[3] = max(b[3], ends[i])

    def entry(step: int | None, b: list[int]) -> dict[str, Any]:
        measured = b[1] - b[0] if b[1] >= b[0] else None
        simulated = b[3] - b[2]
        return {"step": step, "measured_us": measured, "simulated_us": simulated,
                "error_pct": percent(simulated - measured, measured) if measured is not None else None,
                "measured_start_us": b[0] if measured is not None else None, "simulated_start_us": b[2]}

    steps = [entry(s, bounds[s]) for s in sorted(bounds)]
    if bounds:
        whole = [min(b[0] for b in bounds.values()), max(b[1] for b in bounds.values()),
                 min(b[2] for b in bounds.values()), max(b[3] for b in bounds.values())]
    else:
        span = window[1] - window[0] if window else -1
        whole = [0, span, 0, replay.makespan]
    return {"steps": steps, "span": entry(None, whole)}


def format_steps(times: dict[str, Any], label: str = "measured") -> list[str]:
    """Text lines: each step's simulated vs measured time."""
    def one(e: dict[str, Any]) -> str:
        text = f"simulated {e['simulated_us']} us"
        if e["measured_us"] is not None:
            text += f", {label} {e['measured_us']} us ({e['error_pct']:+.2f}%)"
        return text

    lines = [f"  ProfilerStep#{e['step']}: {one(e)}" for e in times["steps"]]
    head = "steps (ProfilerStep boundaries, all ranks):" if times["steps"] else "no ProfilerStep in the trace: span"
    span = times["span"]
    return [head, *lines, f"  {'recorded steps' if times['steps'] else 'whole run'}: {one(span)}"]
