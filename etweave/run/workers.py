"""Converting the ranks: one rank to plain, picklable data, and many ranks in a process pool or on Dask."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from etweave.chakra.io import serialize_framed
from etweave.convert import run_pipeline
from etweave.cpus import default_jobs
from etweave.errors import BadInput, CheckFailed
from etweave.nogc import no_gc
from etweave.process_groups import GroupDescription, describe_groups
from etweave.progress import muted, stage
from etweave.read.host_et import read_host_et
from etweave.read.kineto import KinetoTrace, read_kineto
from etweave.run.discover import RankFiles
from etweave.run.summary import RankSummary, summary_of


class ConvertedRank(msgspec.Struct, frozen=True):
    """One rank converted: plain, picklable data, the same whether converted here, in a process pool or on Dask."""

    rank: int  # the rank the converter wrote (GlobalMetadata attr `rank`)
    # the .et stream, every node checked (`Result.framed_nodes`); or, in the parent, the file it was spilled to as
    # it arrived (`convert_ranks`' `keep`), so a run's parent never holds every rank's bytes at once
    et: bytes | Path
    report: dict[str, Any]  # etweave.report's per-rank audit (JSON-shaped; assemble_run corrects `nodes`)
    local_groups: dict[str, str]  # trace pg name -> the comm-group id this rank's converter wrote
    groups: tuple[GroupDescription, ...]  # every process-group description of its traces
    world_size: int | None  # Kineto distributedInfo.world_size, else the host ET's group of all ranks' size
    trace_rank: int | None  # Kineto distributedInfo.rank (a note when it is not `rank`)
    host: str | None = None  # its input files as the report names them (relative to the run folder)
    kineto: str | None = None
    # what the cross-rank work reads and may change of `et`, found here (None: the parent summarizes it itself)
    summary: RankSummary | None = None


class RankFailure(msgspec.Struct, frozen=True):
    """A rank that could not be converted, as data beside the converted ranks: the outcomes of every rank come back
    alike (the local pool or Dask), an unexpected exception stays an etweave bug, and the caller raises the first
    failure in rank order."""

    rank: int | None
    where: str
    problem: str
    mismatch: bool = False  # its host ET and Kineto trace are not of one run and rank (CheckFailed), else bad input

    def error(self) -> BadInput | CheckFailed:
        return CheckFailed(self.problem) if self.mismatch else BadInput(self.where, self.problem)


RankOutcome = ConvertedRank | RankFailure


def convert_rank(rank: int | None, host: str | None, kineto: str | None, allow_mismatch: bool = False,
                 spill_to: str | None = None) -> RankOutcome:
    """See _convert_rank; the collector is off while it runs (see etweave.nogc)."""
    with no_gc():
        return _convert_rank(rank, host, kineto, allow_mismatch, spill_to)


def _convert_rank(rank: int | None, host: str | None, kineto: str | None, allow_mismatch: bool = False,
                  spill_to: str | None = None) -> RankOutcome:
    """Convert one rank: its ConvertedRank, or a RankFailure on bad input or when its host ET and Kineto trace
    are not of one run and rank (unless allow_mismatch). With `spill_to`, the stream is written to that file and
    `ConvertedRank.et` is its path: a pool worker's stream then never crosses the pipe to the parent (a pickled
    copy there, the parent's unpickled one and its own write to the spool folder cost the parent more per rank
    as the run grows: 9.7 ms a rank at 256 ranks, 12.9 at 1024)."""
    try:
        host_trace = read_host_et(Path(host)) if host is not None else None
        kineto_trace = read_kineto(Path(kineto)) if kineto is not None else None
        groups = tuple(describe_groups(host_trace, kineto_trace))  # before the pipeline lets the events go
        result = run_pipeline(host_trace, kineto_trace, rank, allow_mismatch=allow_mismatch, release_inputs=True)
    except BadInput as exc:
        return RankFailure(rank, exc.where, exc.problem)
    except CheckFailed as exc:
        return RankFailure(rank, "", str(exc), mismatch=True)
    et = serialize_framed(result.metadata_bytes, result.framed_nodes())
    summary = summary_of(et)
    stream: bytes | Path = et
    if spill_to is not None:
        stream = Path(spill_to)
        try:
            stream.write_bytes(et)
        except OSError as exc:
            return RankFailure(rank, str(stream.parent), f"cannot write: {exc.strerror or exc}")
    return ConvertedRank(rank=result.graph.rank, et=stream, report=result.report, local_groups=result.group_ids,
                         groups=groups, world_size=_world_size(kineto_trace, groups),
                         trace_rank=kineto_trace.rank if kineto_trace is not None else None, summary=summary)


def _world_size(kineto: KinetoTrace | None, groups: Sequence[GroupDescription]) -> int | None:
    """Kineto's world size, else the size of the host ET's group of all ranks."""
    size = kineto.distributed.get("world_size") if kineto is not None else None
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    return next((g.size for g in groups if g.ranks == () and g.size is not None), None)


Keep = Callable[[ConvertedRank], ConvertedRank]


def _as_is(out: ConvertedRank) -> ConvertedRank:
    return out


def convert_ranks(ranks: Sequence[RankFiles], jobs: int | None = None, scheduler: str | None = None,
                  progress: bool = False, allow_mismatch: bool = False, keep: Keep = _as_is,
                  spool: Path | None = None) -> list[ConvertedRank]:
    """Run `convert_rank` for every rank: in this process (jobs 1), a process pool, or on a Dask cluster; `keep`
    sees each converted rank as soon as it arrives (it may spill the stream to disk: what it returns is kept).
    With `spool` (a folder), this process or the pool's workers write each stream there themselves
    (`task<i>.et`); a Dask worker's file system need not be ours, so it returns the bytes.
    The outcomes in the order of `ranks`. Raises BadInput for the first rank (in rank order) whose input is bad,
    CheckFailed for the first whose host ET and Kineto trace are not of one run (unless allow_mismatch)."""
    local_spool = spool if scheduler is None else None
    tasks = [(rf.rank, str(rf.host) if rf.host else None, str(rf.kineto) if rf.kineto else None, allow_mismatch,
              str(local_spool / f"task{i}.et") if local_spool is not None else None)
             for i, rf in enumerate(ranks)]
    # One bar for the ranks; the stages inside a rank converted here (jobs 1) stay quiet under it.
    with contextlib.ExitStack() as quiet:
        if not progress:
            quiet.enter_context(muted())
        with stage("converting ranks", len(tasks), "ranks") as bar, muted():
            def arrived(out: RankOutcome) -> RankOutcome:
                bar.advance(1)
                return keep(out) if isinstance(out, ConvertedRank) else out

            if scheduler is not None:
                outputs = _on_dask(tasks, scheduler, arrived)
            else:
                workers = min(jobs or default_jobs(), len(tasks))
                outputs = _local(tasks, workers, arrived)
    converted = [o for o in outputs if isinstance(o, ConvertedRank)]
    failed = [o for o in outputs if isinstance(o, RankFailure)]
    if failed:
        raise failed[0].error()
    return converted


Task = tuple[int | None, str | None, str | None, bool, str | None]


def _local(tasks: list[Task], workers: int, arrived: Callable[[RankOutcome], RankOutcome]) -> list[RankOutcome]:
    """The outcomes in task order, up to the first failure. Each result is handed to `arrived` as it comes and the
    future dropped, so the pool never keeps every rank's stream."""
    if workers <= 1:
        outputs: list[RankOutcome] = []
        for task in tasks:
            outputs.append(arrived(convert_rank(*task)))
            if isinstance(outputs[-1], RankFailure):
                break  # bad input: the rest would be thrown away
        return outputs
    return _in_pool(tasks, workers, arrived)


def _in_pool(tasks: list[Task], workers: int, arrived: Callable[[RankOutcome], RankOutcome]) -> list[RankOutcome]:
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor, as_completed

    # spawn, not fork: the parent may hold threads (a progress bar, a caller's Dask client) that fork would copy
    # in an undefined state.
    ctx = multiprocessing.get_context("spawn")
    results: dict[int, RankOutcome] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        pending: dict[Future[RankOutcome], int] = {pool.submit(convert_rank, *task): i for i, task in enumerate(tasks)}
        for future in as_completed(list(pending)):
            index = pending.pop(future)
            error = future.exception()
            if error is not None:  # an etweave bug, or input it cannot convert yet
                for f in pending:
                    f.cancel()
                raise error
            results[index] = arrived(future.result())
            del future  # as_completed has let go of it too: the stream is freed once `arrived` spilled it
            if isinstance(results[index], RankFailure):
                for f in pending:  # the run has failed: do not start the ranks still queued
                    f.cancel()
                break
    # after a failure: the ranks that were running finished when the pool shut down; a lower rank's failure
    # among them is the one reported (convert_ranks reports the first in rank order)
    for f, i in pending.items():
        if f.done() and not f.cancelled() and f.exception() is None:
            results[i] = arrived(f.result())
    return [results[i] for i in sorted(results)]


# How long a run waits while the cluster has no worker at all (none yet, or every one lost) before giving up;
# ETWEAVE_DASK_WAIT overrides it.
DASK_NO_WORKER_WAIT = 60.0


def _dask_wait() -> float:
    try:
        return float(os.environ.get("ETWEAVE_DASK_WAIT", "") or DASK_NO_WORKER_WAIT)
    except ValueError:
        return DASK_NO_WORKER_WAIT


def _on_dask(tasks: list[Task], address: str, arrived: Callable[[RankOutcome], RankOutcome]) -> list[RankOutcome]:
    try:
        from dask.distributed import Client
    except ImportError as exc:
        raise BadInput("--scheduler", "needs dask[distributed]: pip install 'etweave[cluster]'") from exc
    try:
        client = Client(address, timeout="10s")  # type: ignore[no-untyped-call]  # dask.distributed is unannotated
    except (OSError, TimeoutError) as exc:
        raise BadInput(address, f"cannot connect to the Dask scheduler: {exc}") from exc
    with client:
        # Workers read the trace files by path: they must see RUN_DIR at the same path (a shared file system);
        # the paths are absolute (resolved here, on the client), so the workers' working folder does not matter.
        futures = [client.submit(convert_rank, *task, pure=False) for task in tasks]
        results = _wait_while_workers(client, futures, address, arrived)
        return [results[i] for i in range(len(tasks))]


def _wait_while_workers(client: Any, futures: list[Any], address: str,
                        arrived: Callable[[RankOutcome], RankOutcome]) -> dict[int, RankOutcome]:
    """Every future's outcome by task index, each handed to `arrived` (and released on the cluster) as it
    finishes; bad input when the cluster has had no worker for the wait (`_dask_wait`). `client` and `futures`
    are dask.distributed's Client and Futures, which have no annotations."""
    from dask.distributed import wait

    index = {f.key: i for i, f in enumerate(futures)}
    pending = set(futures)
    results: dict[int, RankOutcome] = {}
    limit = _dask_wait()
    no_workers_since: float | None = None
    while pending:
        try:
            finished, pending = wait(list(pending), timeout=1.0,  # type: ignore[no-untyped-call]  # unannotated
                                     return_when="FIRST_COMPLETED")
        except TimeoutError:  # none finished within the second: see whether any worker is left
            finished = set()
        for f in finished:
            results[index[f.key]] = arrived(f.result())
            f.release()
        del finished
        if not pending:
            break
        if client.scheduler_info().get("workers"):
            no_workers_since = None
            continue
        now = time.monotonic()
        no_workers_since = now if no_workers_since is None else no_workers_since
        if now - no_workers_since >= limit:
            for f in pending:
                f.cancel()
            raise BadInput(address, f"the Dask cluster has had no worker for {limit:g} s ({len(pending)} of "
                                    f"{len(index)} ranks not converted): every worker lost, or none started "
                                    "(ETWEAVE_DASK_WAIT sets the wait)")
    return results
