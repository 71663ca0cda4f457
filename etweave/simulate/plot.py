"""PNG of measured vs simulated busy intervals per resource. matplotlib is optional (the `plot` extra), imported
only here and only when a plot is asked for; no pyplot, so no global backend state is touched."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

from etweave.errors import BadInput
from etweave.nodes import is_marker_node
from etweave.output import write_atomic
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


def write_plot(path: Path, replay: Replay) -> None:
    require_matplotlib(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    window = measured_window(replay)
    origin = window[0] if window else 0
    # (rank, resource) -> intervals in µs after the origin
    measured: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    simulated: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for ri, rg in enumerate(replay.ranks):
        issue, end = replay.issue[ri], replay.end[ri]
        for i, nd in enumerate(rg.nodes):
            key = (rg.rank, nd.resource or NO_RESOURCE)
            if nd.measured_start:
                measured[key].append((nd.measured_start - origin, nd.measured_duration))
            if not is_marker_node(nd.type, nd.kind) and end[i] >= 0:
                simulated[key].append((issue[i], end[i] - issue[i]))
    keys = set(measured) | set(simulated)
    busy = {k: sum(d for _, d in measured.get(k, ())) + sum(d for _, d in simulated.get(k, ())) for k in keys}
    shown = sorted(sorted(keys, key=lambda k: -busy[k])[:MAX_ROWS])

    fig = Figure(figsize=(12, max(3.0, 0.4 * len(shown) + 1.5)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for row, key in enumerate(shown):
        ax.broken_barh(measured.get(key, []), (row + 0.5, 0.4), facecolors="tab:blue",
                       label="measured" if row == 0 else None)
        ax.broken_barh(simulated.get(key, []), (row + 0.1, 0.4), facecolors="tab:orange",
                       label="simulated" if row == 0 else None)
    ax.set_yticks([row + 0.5 for row in range(len(shown))])
    ax.set_yticklabels([f"rank {r} {res}" for r, res in shown], fontsize=8)
    ax.set_ylim(0, max(1, len(shown)))
    ax.invert_yaxis()
    ax.set_xlabel("µs after the earliest measured start" if window else "µs (simulated)")
    title = f"measured vs simulated, makespan {replay.makespan} µs"
    if window:
        title += f" vs measured {window[1] - window[0]} µs"
    if len(shown) < len(keys):
        title += f" ({len(shown)} busiest of {len(keys)} resources)"
    ax.set_title(title)
    if shown:
        ax.legend(loc="upper right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    write_atomic(Path(path), buffer.getvalue())
