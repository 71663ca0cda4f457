"""Whole-run conversion: every rank of a run folder to `<prefix>.<rank>.et`, plus `comm_group.json` and
`report.json`, with cross-rank checks (`etweave convert-run`).

Discovery (`discover`), in RUN_DIR:
  1. Rank folders: a subfolder named `rank<N>` (also `rank_<N>`, `rank-<N>`, any case) is rank N. Every
     `*.json` / `*.json.gz` file in it is one of its traces.
  2. Flat files: a `*.json` / `*.json.gz` file directly in RUN_DIR whose name has a rank, `rank<N>` anywhere
     (also `rank_<N>`, `rank-<N>`, any case) or else `_<N>` right before `.json`, is a trace of rank N
     (`host_rank3.json.gz`, `kineto_3.json`, `sendrecv-rank1.json.gz`).
  3. Only when 1 and 2 find nothing: a folder holding at most one host ET and at most one Kineto trace (names
     without a rank) is a one-rank run; its rank is the Kineto `distributedInfo.rank`, else 0.
  Whether a file is a host ET or a Kineto trace is decided by its content, not its name: the first 4 KB of the
  (decompressed) file; a host ET has `"schema":` / `"nodes":`, a Kineto trace has `"traceEvents"`,
  `"schemaVersion"`, `"deviceProperties"` or `"distributedInfo"` (or is a bare JSON array). A readable file
  that is neither is ignored and listed in the report; an empty or corrupt one is bad input. A rank with only a
  Kineto trace (or only a host ET) is converted from that one file. Bad input (exit 2): no rank found, a rank
  with two host ETs or two Kineto traces.

Per rank, `convert_rank` (a top-level function returning a frozen, picklable `ConvertedRank`, or a `RankFailure`,
so a process pool and a Dask cluster give byte-identical results) runs the single-rank pipeline. Then, on all
ranks together (`assemble_run`):
  - process groups: the host ET `## process_group:init ##`, Kineto `distributedInfo.pg_config` and the
    `Process Group Name`/`Process Group Ranks` event args of every rank (read once, `etweave.process_groups`)
    give one map trace name -> global ranks; the world group is "", every other group gets one decimal id (its
    trace name when that is decimal): a `CommGroups` (`etweave.runfolder`) written to `comm_group.json`, and
    every comm node's `pg_name` is rewritten to it, so one group has one id on every rank.
  - collective sequences: in each group, every member rank must issue the same collectives in the same order
    (ascending node id, the order the simulator matches them in): same kind (from `collective_name`), same
    `comm_seq` where both have one, and same size for the kinds that need equal sizes (all_reduce, reduce,
    all_gather, reduce_scatter, broadcast, barrier; all_to_all sizes legitimately differ). Members of a group
    that are not in the run (world size from Kineto `distributedInfo`) are reported as absent; the present
    ones are checked.
  - durations: a collective's measured duration includes waiting for the slowest peer. For every matched
    collective (before any divergence), each member's `duration_micros` becomes its end (its record's, less
    `record_tail_micros` where the record outlasted it) minus the latest start among the members, clamped to
    >= 0 (>= 1 when measured > 0) and never above its old value, and is also
    written to attr `transfer_duration_micros`; `measured_duration_micros` keeps the measured one.
  - `check_nodes` per rank and `check_run` across ranks on the final nodes: each rank's graph in full, and its
    nodes' own attrs and types where this work changed them (every node was checked when its rank was
    converted).
Outputs are written only when all of that passed (a divergence passes only with `allow_mismatch`), all renamed
into place together; a failed run writes nothing. The parent holds one rank's stream at a time: each converted
rank's stream is written to a spool folder in OUT_DIR by the process that converted it (on Dask, by the parent as
it arrives), and each final stream is staged beside its target as soon as it is final (`RankStreams`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from etweave import progress as progress_ui  # `progress` is a flag here
from etweave.errors import BadInput, CheckFailed
from etweave.output import FileBytes, JsonFile, Writer, commit, discard, output_folder, stage, write_together
from etweave.report import unwaited_collectives
from etweave.run.cross_rank import (
    _SHOWN,
    CollSig,
    RankStreams,
    RunResult,
    _group_label,
    assemble_run,
    build_comm_group,
    check_sequences,
)
from etweave.run.discover import Discovery, RankFiles, discover
from etweave.run.workers import ConvertedRank, RankFailure, convert_rank, convert_ranks
from etweave.runfolder import COMM_GROUP_FILE, REPORT_FILE, CommGroups, et_file_name, split_rank_name

__all__ = ["COMM_GROUP_FILE", "REPORT_FILE", "CollSig", "CommGroups", "ConvertedRank", "Discovery", "RankFailure",
           "RankFiles", "RankStreams", "RunResult", "assemble_run", "build_comm_group", "check_sequences",
           "convert_rank", "convert_ranks", "convert_run", "discover", "stale_outputs", "summary", "write_run"]


def stale_outputs(out_dir: Path, prefix: str, ranks: Iterable[int]) -> list[Path]:
    """`<prefix>.<N>.et` files in out_dir for ranks not in this run: `etweave check OUT_DIR` would mix them in."""
    if not out_dir.is_dir():
        return []
    keep = {et_file_name(prefix, r) for r in ranks}
    return sorted(p for p in out_dir.iterdir()
                  if p.suffix == ".et" and p.name not in keep and _prefix_of(p) == prefix)


def _prefix_of(path: Path) -> str | None:
    named = split_rank_name(path)
    return named[0] if named is not None else None


def write_run(out_dir: Path, prefix: str, result: RunResult) -> list[Path]:
    """Every output staged beside its target, then all renamed into place together (etweave.output.commit): a
    failure anywhere leaves no output new or changed. Rank streams that `RankStreams` staged already (in
    `out_dir`, with `prefix`) are committed as they are; the others are staged here from their bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    moves = result.ranks.staged() if result.ranks.stages_as(out_dir, prefix) else []
    done = {rank for rank, _ in moves}
    # the stream write_et would write, kept by the cross-rank pass; the folder was cleaned once locked
    outputs: list[Writer] = [FileBytes(out_dir / et_file_name(prefix, rank), result.ranks.stream(rank))
                             for rank in sorted(result.ranks) if rank not in done]
    outputs += [JsonFile(out_dir / name, obj) for name, obj in ((COMM_GROUP_FILE, result.comm_group.to_json()),
                                                                  (REPORT_FILE, result.report))]
    if not moves:
        return write_together(outputs, clean=False)
    files = [staged for _, staged in moves]
    try:
        for writer in outputs:
            files.append((stage(Path(writer.path), writer.content(), clean=False), Path(writer.path)))
    except BaseException:
        discard([tmp for tmp, _ in files])
        raise
    commit(files)
    result.ranks.placed()
    return [target for _, target in files]


def convert_run(run_dir: Path, out_dir: Path, prefix: str = "trace", allow_mismatch: bool = False,
                jobs: int | None = None, scheduler: str | None = None, progress: bool = False,
                on_ranks: Callable[[RunResult], None] | None = None) -> RunResult:
    """The whole run (the Python API of `etweave convert-run`). `on_ranks` sees the result before anything is
    written or a divergence raises (the CLI prints its summary there). Raises BadInput, CheckFailed."""
    if not prefix or "/" in prefix or os.sep in prefix:
        raise BadInput("--prefix", f"{prefix!r} must be a plain file name prefix")
    # Resolved here, once: Dask workers get absolute paths (their working folder is not ours), and the report
    # names inputs relative to the run folder, the same however RUN_DIR was spelled.
    run_dir = Path(run_dir).resolve()
    found = discover(run_dir)
    with output_folder(Path(out_dir)):  # created and locked: a second run into it is refused
        return _convert_locked(run_dir, found, Path(out_dir), prefix, allow_mismatch, jobs, scheduler, progress,
                               on_ranks)


def _convert_locked(run_dir: Path, found: Discovery, out_dir: Path, prefix: str, allow_mismatch: bool, jobs: int | None,
                    scheduler: str | None, progress: bool, on_ranks: Callable[[RunResult], None] | None) -> RunResult:
    known = [rf.rank for rf in found.ranks if rf.rank is not None]
    stale = stale_outputs(Path(out_dir), prefix, known)
    if stale and all(rf.rank is not None for rf in found.ranks):
        more = f" and {len(stale) - 5} more" if len(stale) > 5 else ""
        raise BadInput(out_dir, f"holds {len(stale)} .et file(s) of ranks not in this run ("
                                f"{', '.join(p.name for p in stale[:5])}{more}): remove them or choose another "
                                "output folder or --prefix")
    # Each converted rank's stream goes to a spool folder (written by its worker; from Dask, as it arrives), each
    # final one is staged beside its target as it is final: the parent holds one rank at a time. A killed run's
    # spool folder and staged files are removed by the next run into OUT_DIR (etweave.output.folder_lock).
    spool = Path(tempfile.mkdtemp(prefix=SPOOL_PREFIX, dir=out_dir))  # a fresh name: a stale one is never reused
    ranks = RankStreams(Path(out_dir), prefix)
    try:
        spilled = convert_ranks(found.ranks, jobs, scheduler, progress, allow_mismatch, keep=_spiller(spool),
                                spool=spool)
        outputs = [replace(out, host=_relative(rf.host, run_dir), kineto=_relative(rf.kineto, run_dir))
                   for out, rf in zip(spilled, found.ranks, strict=True)]
        found.ignored = [str(_relative(Path(p), run_dir)) for p in found.ignored]
        with progress_ui.stage("cross-rank checks"):
            result = assemble_run(outputs, allow_mismatch, found, ranks)
        if on_ranks is not None:
            on_ranks(result)
        if not result.consistent and not allow_mismatch:
            shown = "; ".join(result.messages[:_SHOWN])
            raise CheckFailed(f"the ranks issue different collectives, nothing written (--allow-mismatch writes "
                              f"anyway): {shown}")
        with progress_ui.stage(f"writing {out_dir}"):
            write_run(Path(out_dir), prefix, result)
    except BaseException:
        ranks.discard()
        raise
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    return result


# The spool folder of a run in its output folder; etweave.output.folder_lock removes any it finds (a killed run's)
SPOOL_PREFIX = ".etweave-run-"


def _spiller(spool: Path) -> Callable[[ConvertedRank], ConvertedRank]:
    """Write each converted rank's stream that arrives as bytes (from Dask) to a file of its own in `spool`; keep
    the rest, with the rank lists of its process groups shared with the ranks before it (every rank lists the
    world group's N ranks: held once, not N times)."""
    count = itertools.count()
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}

    def spill(out: ConvertedRank) -> ConvertedRank:
        groups = tuple(g if g.ranks is None else replace(g, ranks=shared.setdefault(g.ranks, g.ranks))
                       for g in out.groups)
        if isinstance(out.et, Path):
            return replace(out, groups=groups)
        path = spool / f"{next(count)}.et"
        try:
            path.write_bytes(out.et)
        except OSError as exc:
            raise BadInput(spool, f"cannot write: {exc.strerror or exc}") from exc
        return replace(out, et=path, groups=groups)

    return spill


def _relative(path: Path | None, run_dir: Path) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).relative_to(run_dir).as_posix()
    except ValueError:
        return str(path)


def summary(result: RunResult) -> Iterator[str]:
    """Lines for the terminal: one per rank, then the cross-rank result."""
    rep = result.report
    for rank, r in rep["ranks"].items():
        yield _rank_line(rank, r)
    cross = rep["cross_rank"]
    for g in cross["groups"]:
        counts = set(g["collectives_per_rank"].values())
        per = f"{counts.pop()} collectives per rank" if len(counts) == 1 else "different collective counts"
        state = "consistent" if g["consistent"] else f"{len(g['divergences'])} rank(s) diverge"
        absent = f", {g['absent']} absent" if g["absent"] else ""
        yield (f"{_group_label(g['group'])} ({g['members']} members; ranks {g['present']} here{absent}): "
               f"{per}, {state}")
    for line in result.messages:
        yield f"  {line}"
    for note in rep["notes"]:
        yield f"note: {note}"
    for v in cross["notes"]:
        yield f"note: {v['where']}: {v['message']}"
    d = rep["durations"]
    skipped = d["not_overlapping_matches"]
    yield (f"collective durations: {d['adjusted']} of {d['comm_nodes_matched']} matched comm nodes shortened to "
           f"the transfer time (end - latest start among members), largest by {d['max_adjustment_micros']} us"
           + (f"; {skipped} matched collective(s) left as measured: their members do not overlap in time"
              if skipped else ""))
    state = "consistent" if result.consistent else (
        "NOT consistent (written because of --allow-mismatch)" if cross["allow_mismatch"] else "NOT consistent")
    yield f"cross-rank check: {len(result.ranks)} rank(s), {state}"


def _rank_line(rank: str, r: dict[str, Any]) -> str:
    # .get throughout: the per-rank report belongs to etweave.report and may grow or rename fields
    def ratio(kind: str) -> str:
        part = r.get(kind) or {}
        return f"{part.get('output', '?')}/{part.get('input', '?')}"

    orphans = (r.get("orphans") or {}).get("count", 0)
    unwaited = len(unwaited_collectives(r))
    warn = ", ".join(f"{k}={v}" for k, v in (r.get("warnings") or {}).items() if v)
    return (f"rank {rank}: {r.get('nodes', '?')} nodes, {(r.get('edges') or {}).get('total', '?')} edges, host ops "
            f"{ratio('host_ops')}, device ops {ratio('device_ops')}, collectives {ratio('collectives')}, linked by "
            f"{(r.get('link') or {}).get('method', '?')}" + (f", {orphans} orphans" if orphans else "")
            + (f", {unwaited} collective(s) nothing waited for" if unwaited else "")
            + (f"; warnings: {warn}" if warn else ""))
