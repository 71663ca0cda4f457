"""The Python API, re-exported at top level: `etweave.convert_pair`, `etweave.convert_run`,
`etweave.simulate_files` (names that do not shadow the modules `etweave.convert`, `etweave.run` and
`etweave.simulate`). Errors are raised as in the CLI: `BadInput` (unusable input), `CheckFailed` (a check or
consistency violation, a deadlocked replay)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etweave.chakra.io import et_files
from etweave.errors import BadInput, CheckFailed
from etweave.simulate.engine import Replay
from etweave.simulate.timeline import NodeDetail

if TYPE_CHECKING:  # imported on first use at run time: `import etweave` stays cheap
    from etweave.convert import Result
    from etweave.run import RunResult

PathLike = str | Path

__all__ = ["Simulation", "convert_pair", "convert_run", "example_run_dir", "simulate_files"]


def example_run_dir() -> Path:
    """The real 2-rank gloo run bundled with the package (what `etweave example` converts)."""
    from etweave.commands.example_cmd import example_dir

    return example_dir()


def convert_pair(host: PathLike | None, device: PathLike | None, out: PathLike | None = None,
                 report: PathLike | None = None, *, rank: int | None = None, steps: str | None = None,
                 window: str | None = None, allow_mismatch: bool = False) -> Result:
    """One rank's host ET and/or Kineto trace -> a `Result` (`.report`, `.nodes`, `.graph`). With `out`, the
    `.et` file is written (`.gz` name: gzip) and `report` too, as `etweave convert` does; without, nothing is
    written and the nodes are built on first use of `.nodes`. `steps` "A:B" / `window` "START:END" and
    `allow_mismatch` as the CLI's options."""
    from etweave.convert import convert, convert_files
    from etweave.link import Selection
    from etweave.nogc import no_gc
    from etweave.output import write_json

    if host is None and device is None:
        raise BadInput("convert_pair", "give a host ET, a Kineto trace, or both")
    select = Selection.parse(steps, window)
    host_path, device_path = (Path(host) if host else None), (Path(device) if device else None)
    if out is not None:
        return convert(host_path, device_path, Path(out), Path(report) if report else None, rank, select,
                       allow_mismatch)
    with no_gc():
        result = convert_files(host_path, device_path, rank, select, allow_mismatch)
    if report is not None:
        write_json(Path(report), result.report)
    return result


def convert_run(run_dir: PathLike, out_dir: PathLike, *, prefix: str = "trace", allow_mismatch: bool = False,
                jobs: int | None = None, scheduler: str | None = None) -> RunResult:
    """Every rank of a run folder -> `out_dir` (`<prefix>.<rank>.et`, comm_group.json, report.json), as
    `etweave convert-run` does; returns the `RunResult` (`.report`, `.comm_group`, `.ranks`)."""
    from etweave.run import convert_run as run_whole

    return run_whole(Path(run_dir), Path(out_dir), prefix, allow_mismatch, jobs, scheduler)


@dataclass(repr=False)
class Simulation:
    """A replay of `.et` files and its comparison with the measured run. Tables are lists of flat dicts
    (`pandas.DataFrame(sim.nodes())`); `write_csv`, `write_timeline`, `write_plot` and `write_breakdown` write
    files."""

    replay: Replay
    summary: dict[str, Any]  # what `etweave simulate --json` prints
    _details: list[dict[int, NodeDetail]] | None = field(default=None)

    @property
    def details(self) -> list[dict[int, NodeDetail]]:
        """Per rank, node id -> kind, part_of, call-stack parent and dep evidence (read from the files)."""
        if self._details is None:
            from etweave.simulate.timeline import load_details

            self._details = load_details(self.replay)
        return self._details

    def nodes(self) -> list[dict[str, Any]]:
        """One record per node: measured and simulated times, start error, place on the critical path."""
        from etweave.simulate.tables import node_records

        return node_records(self.replay, self.details)

    def steps(self) -> list[dict[str, Any]]:
        """One record per rank and `ProfilerStep#N`: measured and simulated span."""
        from etweave.simulate.tables import step_records

        return step_records(self.replay, self.details)

    def critical_path(self) -> list[dict[str, Any]]:
        """The whole critical path, earliest first (the summary shows only its top contributors)."""
        from etweave.simulate.tables import critical_path_records

        return critical_path_records(self.replay)

    def _write(self, path: PathLike, renderer: str, **options: object) -> None:
        """Through the renderer `simulate` uses for that output (etweave/renderers.py), written atomically."""
        from etweave.output import write_together
        from etweave.renderers import Rendered, replay_renderer

        write_together([Rendered(Path(path), replay_renderer(renderer, **options), self)])

    def write_csv(self, path: PathLike, table: str = "nodes") -> None:
        """`table`: "nodes", "steps" or "critical_path"."""
        self._write(path, "csv", table=table)

    def write_timeline(self, path: PathLike) -> None:
        self._write(path, "timeline")

    def write_plot(self, path: PathLike, ranks: Iterable[int] | None = None,
                   window_ms: tuple[float | None, float | None] | None = None) -> None:
        """Measured vs simulated per rank and resource; `ranks` only these, `window_ms` (start, end) in ms after
        the run's first measured start."""
        self._write(path, "plot", ranks=frozenset(ranks) if ranks is not None else None, window=window_ms)

    def breakdown(self) -> list[dict[str, Any]]:
        """One record per timeline (simulated, measured), rank and step: compute, communication, overlapped,
        exposed communication and idle µs (etweave/simulate/breakdown.py)."""
        from etweave.simulate.breakdown import breakdown

        return breakdown(self.replay)

    def write_breakdown(self, path: PathLike, ranks: Iterable[int] | None = None) -> None:
        """The per-step breakdown as a PNG (needs the plot extra)."""
        self._write(path, "breakdown", ranks=frozenset(ranks) if ranks is not None else None)

    def __repr__(self) -> str:
        s = self.summary
        measured = (f", measured span {s['measured_span_us']} us ({s['makespan_error_pct']:+.2f}%)"
                    if s.get("measured") else "")
        return (f"Simulation({len(s['ranks'])} rank(s) {s['ranks']}, {s['nodes']} nodes, simulated makespan "
                f"{s['simulated_makespan_us']} us{measured}, critical path {s['critical_path']['nodes']} nodes)")


def simulate_files(traces: PathLike | Iterable[PathLike], comm_group: PathLike | None = None, *,
                   jobs: int = 1) -> Simulation:
    """Replay `.et`/`.et.gz` files (or folders of them) together, as `etweave simulate` does. The process-group
    map is `comm_group`, else the comm_group.json beside the traces. `jobs` > 1: from 16 files on, read by this
    process and `jobs` - 1 worker processes side by side (`etweave simulate --jobs`; started with spawn, so a
    script that calls it needs `if __name__ == "__main__":`). Raises CheckFailed on a deadlock."""
    from etweave.runfolder import comm_groups_for, lone_file_rank
    from etweave.simulate.load import load_ranks, replay_files
    from etweave.simulate.metrics import format_deadlock, summarize

    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    paths: Sequence[PathLike] = [traces] if isinstance(traces, str | Path) else list(traces)
    files = et_files([Path(p) for p in paths])
    ranks = load_ranks(files, lone_file_rank(files), jobs)
    group_file, groups = comm_groups_for(files, Path(comm_group) if comm_group is not None else None)
    result = replay_files(ranks, groups or {}, files, group_file, group_option="comm_group")
    if result.stuck_count:
        raise CheckFailed(format_deadlock(result))
    return Simulation(result, summarize(result))
