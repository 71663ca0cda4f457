"""Every output format as one class, chosen by name (as pyinstrument's renderers): a command gathers the outputs
it was asked for, and `etweave.output.write_together` writes them all or none.

- `EtFile`: a Chakra `.et` stream (gzip when the name ends in `.gz`); the JSON report and comm-group map are
  `etweave.output.JsonFile`.
- Renderers of a replay (`REPLAY_RENDERERS`, by name): `timeline` (Chrome/Perfetto JSON, simulate/timeline.py),
  `plot` and `breakdown` (PNG, simulate/plot.py), `csv` (one of the tables of simulate/tables.py).
- Renderers of a replay's summary to standard output (`SUMMARY_RENDERERS`, by name): `json`, `text`.

A renderer only makes bytes; `Rendered` pairs it with a target and a replay into a `Writer`. matplotlib and the
table code are imported only when such an output is asked for."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import et_chunks
from etweave.output import Content

if TYPE_CHECKING:  # the replay's modules are imported only by a command that replays
    from etweave.simulate.engine import Replay
    from etweave.simulate.timeline import NodeDetail

Window = tuple[float | None, float | None]  # ms after the run's first measured start; None: open on that side


class EtFile(msgspec.Struct, frozen=True):
    """A Writer of a `.et` file, streamed node by node."""

    path: Path
    metadata: pb.GlobalMetadata
    nodes: Iterable[pb.Node]

    def content(self) -> Iterator[bytes]:
        return et_chunks(self.path, self.metadata, self.nodes)


class ReplaySource(Protocol):
    """What a renderer of a replay reads: the replay, and per rank the node details read again from the files
    (loaded on first use: only some outputs need them). `etweave.Simulation` is one."""

    @property
    def replay(self) -> Replay: ...

    @property
    def details(self) -> list[dict[int, NodeDetail]]: ...


class ReplayRenderer(Protocol):
    """One output format of a replay. `target` is the file being written, named in errors only."""

    def render(self, source: ReplaySource, target: Path) -> Content: ...


class TimelineRenderer(msgspec.Struct, frozen=True):
    """Chrome/Perfetto trace JSON, measured and simulated side by side."""

    def render(self, source: ReplaySource, target: Path) -> bytes:
        from etweave.simulate.timeline import timeline_bytes

        return timeline_bytes(source.replay, source.details)


class PlotRenderer(msgspec.Struct, frozen=True):
    """PNG of measured vs simulated busy intervals per rank and resource; `ranks`, `window`: only those."""

    ranks: frozenset[int] | None = None
    window: Window | None = None

    def render(self, source: ReplaySource, target: Path) -> bytes:
        from etweave.simulate.plot import plot_png, require_matplotlib

        require_matplotlib(target)
        return plot_png(source.replay, set(self.ranks) if self.ranks is not None else None, self.window)


class BreakdownRenderer(msgspec.Struct, frozen=True):
    """PNG of each rank's steps split into compute, overlapped and exposed communication, idle."""

    ranks: frozenset[int] | None = None

    def render(self, source: ReplaySource, target: Path) -> bytes:
        from etweave.simulate.breakdown import breakdown
        from etweave.simulate.plot import breakdown_png, require_matplotlib

        require_matplotlib(target)
        return breakdown_png(breakdown(source.replay), set(self.ranks) if self.ranks is not None else None, target)


TABLES = ("critical_path", "nodes", "steps")


class CsvRenderer(msgspec.Struct, frozen=True):
    """One table of the replay as CSV: `nodes` (one row per node), `steps` (per rank and ProfilerStep#N) or
    `critical_path` (the whole path, earliest first)."""

    table: str = "nodes"

    def __post_init__(self) -> None:
        if self.table not in TABLES:
            raise ValueError(f"table must be one of {sorted(TABLES)}, not {self.table!r}")

    def records(self, source: ReplaySource) -> list[dict[str, Any]]:
        from etweave.simulate import tables

        if self.table == "critical_path":  # needs no node details: they are not read
            return tables.critical_path_records(source.replay)
        if self.table == "steps":
            return tables.step_records(source.replay, source.details)
        return tables.node_records(source.replay, source.details)

    def render(self, source: ReplaySource, target: Path) -> Iterator[bytes]:
        from etweave.simulate import tables

        columns = {"nodes": tables.NODE_COLUMNS, "steps": tables.STEP_COLUMNS,
                   "critical_path": tables.CRITICAL_COLUMNS}[self.table]
        return tables.csv_chunks(self.records(source), columns)


# name -> the renderer's class; its options are the class's fields
REPLAY_RENDERERS: Mapping[str, Callable[..., ReplayRenderer]] = {
    "timeline": TimelineRenderer,
    "plot": PlotRenderer,
    "breakdown": BreakdownRenderer,
    "csv": CsvRenderer,
}


def replay_renderer(name: str, **options: object) -> ReplayRenderer:
    """The renderer registered as `name`, made with `options` (ValueError for an unknown name)."""
    if name not in REPLAY_RENDERERS:
        raise ValueError(f"no renderer {name!r}; there are {sorted(REPLAY_RENDERERS)}")
    return REPLAY_RENDERERS[name](**options)


class Rendered(msgspec.Struct, frozen=True):
    """A Writer: `renderer`'s output for `source`, made only when it is staged."""

    path: Path
    renderer: ReplayRenderer
    source: ReplaySource

    def content(self) -> Content:
        return self.renderer.render(self.source, self.path)


class SummaryRenderer(Protocol):
    """A replay's summary (what `simulate --json` prints) as the text standard output receives."""

    def render(self, summary: dict[str, Any]) -> bytes: ...


class JsonSummary(msgspec.Struct, frozen=True):
    """Indented, keys in the order the summary holds them."""

    def render(self, summary: dict[str, Any]) -> bytes:
        return orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n"


# the outputs written, in the order the text names them
WRITTEN_KEYS = ("timeline", "plot", "breakdown", "csv", "steps_csv")


class TextSummary(msgspec.Struct, frozen=True):
    """The summary, the what-if edits, each step's simulated time, and the files written."""

    def render(self, summary: dict[str, Any]) -> bytes:
        from etweave.simulate.metrics import format_text
        from etweave.simulate.steps import format_steps

        text = format_text(summary)
        if "whatif" in summary:
            text += "\nwhat-if (simulated: the edited graph; measured: the run the files came from):"
            text += "".join(f"\n  {e['edit']}: {e['ops']} op(s), {e['nodes']} node(s), {e['before_us']} -> "
                            f"{e['after_us']} us ({e['added_us']:+d} us)"
                            + (f", {e['unfitted_nodes']} without comm_size (divided by the factor)"
                               if e.get("unfitted_nodes") else "") for e in summary["whatif"])
        text += "\n" + "\n".join(format_steps(summary["step_times"]))
        text += "".join(f"\nwrote {key} {summary[key]}" for key in WRITTEN_KEYS if key in summary)
        return text.encode() + b"\n"


SUMMARY_RENDERERS: Mapping[str, Callable[[], SummaryRenderer]] = {"json": JsonSummary, "text": TextSummary}


def summary_renderer(name: str) -> SummaryRenderer:
    if name not in SUMMARY_RENDERERS:
        raise ValueError(f"no summary renderer {name!r}; there are {sorted(SUMMARY_RENDERERS)}")
    return SUMMARY_RENDERERS[name]()

