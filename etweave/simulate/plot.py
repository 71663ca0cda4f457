"""PNGs: measured vs simulated busy intervals per resource, and the per-step breakdown (breakdown.py).
matplotlib is optional (the `plot` extra), imported only here and only when a plot is asked for; no pyplot, so no
global backend state is touched."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

from etweave.errors import BadInput
from etweave.fidelity import RANK_START_OFFSET
from etweave.nodes import is_marker_node
from etweave.simulate.engine import Replay
from etweave.simulate.metrics import measured_window
from etweave.simulate.timeline import NO_RESOURCE

MAX_ROWS = 48  # beyond this the figure is unreadable; the busiest resources are shown


def require_matplotlib(out: Path) -> None:
    """Fail before the replay, not after, when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise BadInput(out, "--plot needs matplotlib: pip install etweave[plot]") from exc


def parse_ranks(text: str) -> set[int]:
    """"0,2-3" -> {0, 2, 3} (--plot-ranks)."""
    out: set[int] = set()
    for term in text.split(","):
        lo, sep, hi = term.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise BadInput("--plot-ranks", f"{text!r} is not a list of ranks like 0,2-3")
        out.update(range(int(lo), int(hi if sep else lo) + 1))
    return out


def parse_window(text: str) -> tuple[float | None, float | None]:
    """"START:END" in ms after the run's first measured start, either side may be empty (--plot-window)."""
    lo, sep, hi = text.partition(":")
    try:
        start, end = (float(lo) if lo.strip() else None), (float(hi) if hi.strip() else None)
    except ValueError:
        sep = ""  # not a number: refused below
        start = end = None
    if not sep or (start is not None and end is not None and start >= end):
        raise BadInput("--plot-window", f"{text!r} is not START:END in ms (START < END; either may be empty)")
    return start, end


def _figure(rows: int) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, max(3.0, 0.4 * rows + 1.5)), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _png(fig: Any, ax: Any) -> bytes:
    # beside the axes, so it covers no track
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0, fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


Intervals = dict[tuple[int, str], list[tuple[float, float]]]  # (rank, resource) -> (start, length) in ms


def plot_png(replay: Replay, ranks: set[int] | None = None,
             window: tuple[float | None, float | None] | None = None) -> bytes:
    """Measured and simulated busy intervals per rank and resource, in ms after the run's first measured start.
    `ranks`: only these; `window` (ms, either side None): only that time range. Needs matplotlib
    (`require_matplotlib`)."""
    frame = measured_window(replay)
    measured, simulated = _busy(replay, ranks, frame[0] if frame else 0)
    keys = set(measured) | set(simulated)
    busy = {k: sum(d for _, d in measured.get(k, ())) + sum(d for _, d in simulated.get(k, ())) for k in keys}
    shown = sorted(sorted(keys, key=lambda k: -busy[k])[:MAX_ROWS])

    fig, ax = _figure(len(shown))
    for row, key in enumerate(shown):
        ax.broken_barh(measured.get(key, []), (row + 0.5, 0.4), facecolors="tab:blue",
                       label="measured" if row == 0 else None)
        ax.broken_barh(simulated.get(key, []), (row + 0.1, 0.4), facecolors="tab:orange",
                       label="simulated" if row == 0 else None)
    ax.set_yticks([row + 0.5 for row in range(len(shown))])
    ax.set_yticklabels([f"rank {r} {res}" for r, res in shown], fontsize=8)
    ax.set_ylim(0, max(1, len(shown)))
    ax.invert_yaxis()
    if window is not None and window != (None, None):
        last = max((s + d for ivs in (*measured.values(), *simulated.values()) for s, d in ivs), default=0.0)
        ax.set_xlim(*_x_range(window, last))
    ax.ticklabel_format(axis="x", useOffset=False, style="plain")  # times are small already: no "+1e6"
    ax.set_xlabel("ms after the run's first measured start" if frame else "ms (simulated)")
    title = f"measured vs simulated, makespan {replay.makespan / 1000:.3f} ms"
    if frame:
        title += f" vs measured {(frame[1] - frame[0]) / 1000:.3f} ms"
    if len(shown) < len(keys):
        title += f" ({len(shown)} busiest of {len(keys)} resources)"
    ax.set_title(title)
    return _png(fig, ax)


def _busy(replay: Replay, ranks: set[int] | None, origin: int) -> tuple[Intervals, Intervals]:
    """Measured and simulated busy intervals per (rank, resource), in ms after `origin`; bad input when `ranks`
    names none of the ranks replayed."""
    measured: Intervals = defaultdict(list)
    simulated: Intervals = defaultdict(list)
    for ri, rg in enumerate(replay.ranks):
        if ranks is not None and rg.rank not in ranks:
            continue
        issue, end = replay.issue[ri], replay.end[ri]
        for i, nd in enumerate(rg.nodes):
            if nd.name == RANK_START_OFFSET:
                continue  # when the rank started, not work
            key = (rg.rank, nd.resource or NO_RESOURCE)
            if nd.measured_start:
                measured[key].append(((nd.measured_start - origin) / 1000, nd.measured_duration / 1000))
            if not is_marker_node(nd.type, nd.kind) and end[i] >= 0:
                simulated[key].append((issue[i] / 1000, (end[i] - issue[i]) / 1000))
    if ranks is not None and not (measured or simulated):
        raise BadInput("--plot-ranks", f"none of ranks {sorted(ranks)} is among those simulated "
                                       f"({sorted(rg.rank for rg in replay.ranks)})")
    return measured, simulated


def _x_range(window: tuple[float | None, float | None], last: float) -> tuple[float, float]:
    """The x axis of --plot-window (ms; an open side: 0 or the last end); bad input when it misses the run."""
    lo_ms, hi_ms = window
    left, right = lo_ms if lo_ms is not None else 0.0, hi_ms if hi_ms is not None else last
    if left >= min(right, last):
        raise BadInput("--plot-window", f"{left:g}:{right:g} ms lies outside the run (0 to {last:.3f} ms)")
    return left, right


BREAKDOWN_PARTS = [  # (record field, legend label, colour): the four parts that add up to a step's span
    ("compute_only_us", "compute (no communication)", "tab:green"),
    ("overlapped_us", "communication overlapped by compute", "tab:olive"),
    ("exposed_communication_us", "exposed communication", "tab:red"),
    ("idle_us", "idle", "lightgrey"),
]


def breakdown_png(records: list[dict[str, Any]], ranks: set[int] | None, target: Path) -> bytes:
    """A stacked bar per rank and step (simulated above measured) from `breakdown.breakdown` records; `target`,
    the file being written, is named when there is nothing to draw. Needs matplotlib (`require_matplotlib`)."""
    rows = [r for r in records if ranks is None or r["rank"] in ranks]
    if not rows:
        raise BadInput(target, "no rank and step to draw")
    rows.sort(key=lambda r: (r["rank"], r["step"] if r["step"] is not None else -1, r["timeline"] != "simulated"))
    fig, ax = _figure(len(rows))
    for n, (field, label, colour) in enumerate(BREAKDOWN_PARTS):
        left = [sum(r[f] for f, _, _ in BREAKDOWN_PARTS[:n]) / 1000 for r in rows]
        ax.barh(range(len(rows)), [r[field] / 1000 for r in rows], left=left, color=colour, label=label)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r['rank']} {'step ' + str(r['step']) if r['step'] is not None else 'whole run'} "
                        f"{r['timeline']}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.ticklabel_format(axis="x", useOffset=False, style="plain")
    ax.set_xlabel("ms of the step's span")
    ax.set_title("per rank and step: compute, communication, exposed communication, idle")
    return _png(fig, ax)
