"""Compare a replay with the measured timeline. Everything is a plain JSON-able dict; `format_text` renders it.

Common frame: simulated time 0 is placed at the earliest measured start over all ranks (`origin_us`), and all
times in the summary are µs after that origin. A node counts as measured when its `start_time_micros` is nonzero.
Per-node start error compares a node's simulated *issue* time with its measured start: a collective's measured
start (its kernel start) is when it reached its stream, not when the transfer began. Per-collective start error
compares the simulated common start with the latest measured start among the members given (when the last one
arrived, i.e. when the measured transfer could begin).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain, compress, islice, repeat
from operator import add, and_, attrgetter, countOf, indexOf, ne, sub
from typing import Any

from etweave.fidelity import RANK_START_OFFSET
from etweave.simulate.engine import RankGraph, Replay, SimNode
from etweave.stats import percent, percentile

TOP_CRITICAL = 10
TOP_COLLECTIVES = 10


def _error_stats(errors: list[int], span: int) -> dict[str, Any]:
    absolute = sorted(map(abs, errors))
    p50, p95 = percentile(absolute, 50), percentile(absolute, 95)
    worst = absolute[-1] if absolute else 0
    return {
        "count": len(absolute),
        "p50_us": p50, "p95_us": p95, "max_us": worst,
        "p50_pct_of_span": percent(p50, span), "p95_pct_of_span": percent(p95, span),
        "max_pct_of_span": percent(worst, span),
    }


def measured_window(replay: Replay) -> tuple[int, int] | None:
    """(earliest start, latest end) over measured nodes of all ranks, or None if nothing was measured."""
    return _window(map(_measured_times, replay.ranks))


def _measured_times(rg: RankGraph) -> tuple[list[int], list[int]]:
    """A rank's measured start and end per node, as columns (a start of 0: not measured). Columns and min/max
    over them in C: this runs over every node of every rank."""
    starts = [nd.measured_start for nd in rg.nodes]
    return starts, list(map(add, starts, [nd.measured_duration for nd in rg.nodes]))


def _window(ranks: Iterable[tuple[list[int], list[int]]]) -> tuple[int, int] | None:
    window: tuple[int, int] | None = None
    for starts, ends in ranks:
        if not any(starts):
            continue
        lo = min(filter(None, starts))
        hi = max(compress(ends, starts))
        window = (lo, hi) if window is None else (min(window[0], lo), max(window[1], hi))
    return window


def summarize(replay: Replay) -> dict[str, Any]:
    """The replay beside the measured run: makespan, start errors, critical path, collectives, per rank."""
    times = [_measured_times(rg) for rg in replay.ranks]
    window = _window(times)
    origin = window[0] if window else 0
    span = window[1] - window[0] if window else 0
    node_errors: list[int] = []
    per_rank = [_rank_summary(replay, ri, times[ri], origin, node_errors) for ri in range(len(replay.ranks))]
    critical_path = _critical_path_summary(replay)
    return {
        "ranks": [rg.rank for rg in replay.ranks],
        "nodes": sum(len(rg.nodes) for rg in replay.ranks),
        "notes": list(replay.notes),
        "simulated_makespan_us": replay.makespan,
        "measured": window is not None,
        "origin_us": origin if window else None,
        "measured_span_us": span if window else None,
        "makespan_error_pct": percent(replay.makespan - span, span) if window else None,
        "start_error": _error_stats(node_errors, span),
        "critical_path": critical_path,
        "collectives": _collectives_summary(replay, origin, span),
        "per_rank": per_rank,
    }


def _rank_summary(replay: Replay, ri: int, times: tuple[list[int], list[int]], origin: int,
                  node_errors: list[int]) -> dict[str, Any]:
    """One rank's entry; appends the start error of each of its measured nodes (common frame) to `node_errors`.
    In whole-column passes (map, compress): this runs over every node of every rank."""
    rg = replay.ranks[ri]
    nodes, issue, end = rg.nodes, replay.issue[ri], replay.end[ri]
    starts = times[0]
    errors = list(map(sub, map(add, compress(issue, starts), repeat(origin)), filter(None, starts)))
    node_errors += errors
    entry: dict[str, Any] = {"rank": rg.rank, "file": rg.source, "nodes": len(nodes),
                             "simulated_makespan_us": max(end, default=0), "measured_span_us": None}
    frame = _own_frame(nodes, issue, times, errors, origin)
    if frame is not None:
        lo, hi, first, own_errors = frame
        entry["measured_span_us"] = hi - lo
        # a rank whose trace begins later shows that skew in the common frame, so also give the error in the
        # rank's own frame (simulated times less the rank's simulated first issue)
        entry["measured_first_start_us"] = lo - origin
        entry["simulated_first_start_us"] = first
        entry["start_error_own_frame"] = _error_stats(own_errors, hi - lo)
    return entry


_name = attrgetter("name")


def _own_frame(nodes: list[SimNode], issue: list[int], times: tuple[list[int], list[int]], errors: list[int],
               origin: int) -> tuple[int, int, int, list[int]] | None:
    """A rank's own frame: its measured nodes but the synthetic [rank start offset] node, which "starts" at the
    run's first instant, not at this rank's own start. (Their first measured start, last measured end, first
    simulated issue, and the start error of each in that frame: simulated issue less the first one against the
    measured start less the first one), or None when no node is in it. From the common frame's `errors` (the
    same nodes, or those but one) where the rank has one such node at most (a convert-run output: one)."""
    starts, ends = times
    try:
        k = indexOf(map(_name, nodes), RANK_START_OFFSET)
    except ValueError:
        k = -1  # (no such node: every measured node is in the frame)
    if k >= 0 and countOf(map(_name, islice(nodes, k + 1, None)), RANK_START_OFFSET):
        own = list(map(and_, map(bool, starts), map(ne, map(_name, nodes), repeat(RANK_START_OFFSET))))
        if not any(own):
            return None
        lo, first = min(compress(starts, own)), min(compress(issue, own))
        return lo, max(compress(ends, own)), first, list(map(add, map(sub, compress(issue, own),
                                                                      compress(starts, own)), repeat(lo - first)))
    if k < 0 or not starts[k]:
        kept = errors
        parts = [(starts, ends, issue)]
    else:  # the frame's nodes are the measured ones before node k and after it
        at = k - starts[:k].count(0)  # node k's place among the measured nodes, in `errors`
        kept = errors[:at] + errors[at + 1:]
        parts = [(starts[:k], ends[:k], issue[:k]), (starts[k + 1:], ends[k + 1:], issue[k + 1:])]
    if not kept:
        return None
    lo = min(chain.from_iterable(filter(None, p[0]) for p in parts))
    first = min(chain.from_iterable(compress(p[2], p[0]) for p in parts))
    shift = lo - first - origin  # an error in the common frame is issue + origin - start
    return (lo, max(chain.from_iterable(compress(p[1], p[0]) for p in parts)), first,
            list(map(add, kept, repeat(shift))) if shift else kept)


def _critical_path_summary(replay: Replay) -> dict[str, Any]:
    critical: list[dict[str, Any]] = []
    offset_on_path: list[dict[str, Any]] = []  # an initial condition of the run, reported beside the path's work
    for (ri, i), contribution in zip(replay.critical_path, replay.contribution, strict=True):
        nd = replay.ranks[ri].nodes[i]
        (offset_on_path if nd.name == RANK_START_OFFSET else critical).append({
            "rank": replay.ranks[ri].rank, "id": nd.id, "name": nd.name, "resource": nd.resource,
            "start_us": replay.start[ri][i], "contribution_us": contribution,
        })
    return {
        "nodes": len(critical) + len(offset_on_path),
        "length_us": sum(replay.contribution),
        "rank_start_offset_us": sum(c["contribution_us"] for c in offset_on_path),
        "rank_start_offset_ranks": [c["rank"] for c in offset_on_path],
        "top": sorted(critical, key=lambda c: (-c["contribution_us"], c["start_us"]))[:TOP_CRITICAL],
    }


def _collectives_summary(replay: Replay, origin: int, span: int) -> dict[str, Any]:
    """Each collective instance's simulated common start beside its last measured arrival."""
    collectives = []
    for inst in replay.collectives:
        if not inst.nodes:
            continue
        ri0, i0 = inst.nodes[0]
        arrivals = [replay.ranks[ri].nodes[i].measured_start for ri, i in inst.nodes]
        arrivals = [m for m in arrivals if m]
        sim_start = replay.start[ri0][i0]
        item: dict[str, Any] = {
            "pg": inst.pg, "seq": inst.seq, "name": replay.ranks[ri0].nodes[i0].name,
            "ranks": [replay.ranks[ri].rank for ri, _ in inst.nodes],
            "simulated_start_us": sim_start,
            "measured_start_us": max(arrivals) - origin if arrivals else None,
            "start_error_us": sim_start + origin - max(arrivals) if arrivals else None,
        }
        collectives.append(item)
    coll_errors = [c["start_error_us"] for c in collectives if c["start_error_us"] is not None]
    worst = sorted((c for c in collectives if c["start_error_us"] is not None),
                   key=lambda c: -abs(c["start_error_us"]))[:TOP_COLLECTIVES]
    return {
        "count": len(collectives),
        "start_error": _error_stats(coll_errors, span),
        "worst": worst,
        "items": collectives,
    }


def _fmt_err(stats: dict[str, Any]) -> str:
    def one(q: str) -> str:
        pct = stats[f"{q}_pct_of_span"]
        return f"{q} {stats[f'{q}_us']:g} us" + (f" ({pct:.2f}% of span)" if pct is not None else "")
    return ", ".join(one(q) for q in ("p50", "p95", "max"))


def format_text(summary: dict[str, Any]) -> str:
    s = summary
    lines = [f"simulated {len(s['ranks'])} rank(s) {s['ranks']}, {s['nodes']} nodes"]
    lines += [f"note: {note}" for note in s["notes"]]
    lines += [f"warning: {warning}" for warning in s.get("warnings", [])]
    if s["measured"]:
        lines.append(f"makespan: simulated {s['simulated_makespan_us']} us, measured span {s['measured_span_us']} us, "
                     f"error {s['makespan_error_pct']:+.2f}%")
        err = s["start_error"]
        lines.append(f"start error over {err['count']} measured nodes: {_fmt_err(err)}")
    else:
        lines.append(f"makespan: simulated {s['simulated_makespan_us']} us; no node has a measured start, "
                     "so there is nothing to compare with")
    if len(s["per_rank"]) > 1:
        for r in s["per_rank"]:
            line = f"  rank {r['rank']}: simulated {r['simulated_makespan_us']} us"
            if r["measured_span_us"] is not None:
                own = r["start_error_own_frame"]
                line += (f" from +{r['simulated_first_start_us']} us, measured span {r['measured_span_us']} us "
                         f"from +{r['measured_first_start_us']} us; "
                         f"start error in its own frame p50 {own['p50_us']:g} us, max {own['max_us']:g} us")
            lines.append(line)
    cp = s["critical_path"]
    head = f"critical path: {cp['nodes']} nodes, {cp['length_us']} us"
    if cp.get("rank_start_offset_us"):
        head += (f", of which {cp['rank_start_offset_us']} us before rank(s) {cp['rank_start_offset_ranks']} began "
                 f"(the {RANK_START_OFFSET}: when the rank started, not work)")
    lines.append(head + "; top by contribution:")
    for c in cp["top"]:
        lines.append(f"  {c['contribution_us']:>10} us  rank {c['rank']} node {c['id']} [{c['resource'] or '-'}] "
                     f"{c['name']}")
    colls = s["collectives"]
    if colls["count"]:
        line = f"collectives: {colls['count']}"
        if colls["start_error"]["count"]:
            line += f"; start error {_fmt_err(colls['start_error'])}; worst:"
        lines.append(line)
        for c in colls["worst"]:
            lines.append(f"  pg {c['pg']!r} #{c['seq']} {c['name']} ranks {c['ranks']}: simulated start "
                         f"{c['simulated_start_us']} us, measured {c['measured_start_us']} us, "
                         f"error {c['start_error_us']:+d} us")
    return "\n".join(lines)


def deadlock_report(replay: Replay) -> dict[str, Any]:
    return {
        "stuck_nodes": replay.stuck_count,
        "shown": [{"rank": s.rank, "id": s.node_id, "name": s.name, "waits_for": s.waits_for} for s in replay.stuck],
        "notes": list(replay.notes),
    }


def format_deadlock(replay: Replay) -> str:
    ranks = sorted({s.rank for s in replay.stuck})
    lines = [f"deadlock: {replay.stuck_count} nodes can never start "
             f"(showing {len(replay.stuck)}, root causes first; shown on ranks {ranks})"]
    lines += [f"  rank {s.rank} node {s.node_id} {s.name!r}: {s.waits_for}" for s in replay.stuck]
    lines += [f"  note: {note}" for note in replay.notes]
    return "\n".join(lines)
