"""Converting the ranks: one rank to plain, picklable data, and many ranks in a process pool or on Dask."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from etweave.chakra.io import serialize
from etweave.convert import no_gc, process_groups, run_pipeline
from etweave.errors import BadInput, CheckFailed
from etweave.progress import muted, stage
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.run.discover import RankFiles


def convert_rank(rank: int | None, host: str | None, kineto: str | None, allow_mismatch: bool = False) \
        -> dict[str, Any]:
    """See _convert_rank; the collector is off while it runs (see etweave.convert.no_gc)."""
    with no_gc():
        return _convert_rank(rank, host, kineto, allow_mismatch)


def _convert_rank(rank: int | None, host: str | None, kineto: str | None, allow_mismatch: bool = False) \
        -> dict[str, Any]:
    """Convert one rank; plain, picklable data back (the same whether run here, in a pool or on Dask).

    Returns {"rank", "et" (the .et stream bytes), "report", "local_groups" (trace pg name -> the id the
    converter wrote), "groups" (pg descriptions), "world_size", "trace_rank"}, or {"rank", "error": {"where",
    "problem"}} on bad input (BadInput does not survive pickling: its constructor takes two arguments), or
    {"rank", "mismatch": message} when its host ET and Kineto trace are not of one run and rank.
    """
    try:
        host_trace = read_host_et(Path(host)) if host is not None else None
        kineto_trace = read_kineto(Path(kineto)) if kineto is not None else None
    except BadInput as exc:
        return {"rank": rank, "error": {"where": exc.where, "problem": exc.problem}}
    groups: list[dict[str, Any]] = []
    world: int | None = None
    if host_trace is not None:
        for grp in host_trace.process_groups() or []:
            if isinstance(grp, dict):
                groups.append({"name": str(grp.get("pg_name", "")), "ranks": _ranks(grp.get("ranks")),
                               "size": grp.get("group_size"), "source": "host"})
    trace_rank: int | None = None
    if kineto_trace is not None:
        info = kineto_trace.distributed
        trace_rank = kineto_trace.rank
        size = info.get("world_size")
        world = size if isinstance(size, int) and not isinstance(size, bool) else None
        cfg = info.get("pg_config")
        for grp in cfg if isinstance(cfg, list) else []:
            if isinstance(grp, dict):
                groups.append({"name": str(grp.get("pg_name", "")), "ranks": _ranks(grp.get("ranks")),
                               "size": grp.get("pg_size"), "source": "kineto_pg_config"})
        seen: set[tuple[str, str]] = set()
        events = kineto_trace.events
        for i in (*events.cpu, *events.gpu):  # record_param_comms ops and NCCL kernels carry them
            args = events[i].args
            if args.pg_name is None or args.pg_ranks is None:
                continue
            key = (str(args.pg_name), str(args.pg_ranks))
            if key not in seen:
                seen.add(key)
                groups.append({"name": key[0], "ranks": _ranks(args.pg_ranks), "size": None,
                               "source": "kineto_args"})
    if world is None:  # the host ET's group of all ranks says how many there are
        world = next((g["size"] for g in groups if g["ranks"] == [] and isinstance(g["size"], int)), None)
    local = process_groups(host_trace, kineto_trace)
    try:
        result = run_pipeline(host_trace, kineto_trace, rank, allow_mismatch=allow_mismatch)
    except BadInput as exc:
        return {"rank": rank, "error": {"where": exc.where, "problem": exc.problem}}
    except CheckFailed as exc:
        return {"rank": rank, "mismatch": str(exc)}
    out_rank = next(int(a.int64_val) for a in result.metadata.attr if a.name == "rank")
    return {"rank": out_rank, "et": serialize(result.metadata, result.checked_nodes()), "report": result.report,
            "local_groups": local, "groups": groups, "world_size": world, "trace_rank": trace_rank}


def _ranks(value: Any) -> list[int] | None:
    """A rank list from a pg description or a Kineto arg (a list, or its JSON text); [] means all ranks."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    if value == "all":
        return []
    if isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        return sorted(value)
    return None


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def convert_ranks(ranks: Sequence[RankFiles], jobs: int | None = None, scheduler: str | None = None,
                  progress: bool = False, allow_mismatch: bool = False) -> list[dict[str, Any]]:
    """Run `convert_rank` for every rank: in this process (jobs 1), a process pool, or on a Dask cluster.
    Raises BadInput for the first rank (in rank order) whose input is bad, CheckFailed for the first whose
    host ET and Kineto trace are not of one run (unless allow_mismatch)."""
    tasks = [(rf.rank, str(rf.host) if rf.host else None, str(rf.kineto) if rf.kineto else None, allow_mismatch)
             for rf in ranks]
    # One bar for the ranks; the stages inside a rank converted here (jobs 1) stay quiet under it.
    with contextlib.ExitStack() as quiet:
        if not progress:
            quiet.enter_context(muted())
        with stage("converting ranks", len(tasks), "ranks") as bar, muted():
            if scheduler is not None:
                outputs = _on_dask(tasks, scheduler, bar.advance)
            else:
                workers = min(jobs or default_jobs(), len(tasks))
                outputs = _local(tasks, workers, bar.advance)
    failed = [o for o in outputs if "error" in o or "mismatch" in o]
    if failed and "error" in failed[0]:
        err = failed[0]["error"]
        raise BadInput(err["where"], err["problem"])
    if failed:
        raise CheckFailed(failed[0]["mismatch"])
    return outputs


def _local(tasks: list[tuple[int | None, str | None, str | None, bool]], workers: int,
           done: Callable[[int], Any]) -> list[dict[str, Any]]:
    if workers <= 1:
        outputs = []
        for task in tasks:
            outputs.append(convert_rank(*task))
            done(1)
            if "error" in outputs[-1] or "mismatch" in outputs[-1]:
                break  # bad input: the rest would be thrown away
        return outputs
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn, not fork: the parent may hold threads (a progress bar, a caller's Dask client) that fork would copy
    # in an undefined state.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(convert_rank, *task) for task in tasks]
        for future in as_completed(futures):
            done(1)
            if future.exception() is not None or "error" in future.result() or "mismatch" in future.result():
                for f in futures:  # the run has failed: do not start the ranks still queued
                    f.cancel()
                break
        failed = [f for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            raise failed[0].exception()  # type: ignore[misc]  # an etweave bug, or input it cannot convert yet
        return [f.result() for f in futures if f.done() and not f.cancelled()]


# How long a run waits while the cluster has no worker at all (none yet, or every one lost) before giving up;
# ETWEAVE_DASK_WAIT overrides it.
DASK_NO_WORKER_WAIT = 60.0


def _dask_wait() -> float:
    try:
        return float(os.environ.get("ETWEAVE_DASK_WAIT", "") or DASK_NO_WORKER_WAIT)
    except ValueError:
        return DASK_NO_WORKER_WAIT


def _on_dask(tasks: list[tuple[int | None, str | None, str | None, bool]], address: str,
             done: Callable[[int], Any]) -> list[dict[str, Any]]:
    try:
        from dask.distributed import Client, wait
    except ImportError as exc:
        raise BadInput("--scheduler", "needs dask[distributed]: pip install 'etweave[cluster]'") from exc
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise BadInput(address, f"cannot connect to the Dask scheduler: {exc}") from exc
    with client:
        # Workers read the trace files by path: they must see RUN_DIR at the same path (a shared file system);
        # the paths are absolute (resolved here, on the client), so the workers' working folder does not matter.
        futures = [client.submit(convert_rank, *task, pure=False) for task in tasks]
        pending = set(futures)
        limit = _dask_wait()
        no_workers_since: float | None = None
        while pending:
            try:
                finished, pending = wait(list(pending), timeout=1.0, return_when="FIRST_COMPLETED")
            except TimeoutError:  # none finished within the second: see whether any worker is left
                finished = set()
            done(len(finished))
            if not pending:
                break
            if client.scheduler_info().get("workers"):
                no_workers_since = None
                continue
            now = time.monotonic()
            no_workers_since = now if no_workers_since is None else no_workers_since
            if now - no_workers_since >= limit:
                for f in futures:
                    f.cancel()
                raise BadInput(address, f"the Dask cluster has had no worker for {limit:g} s ({len(pending)} of "
                                        f"{len(futures)} ranks not converted): every worker lost, or none started "
                                        "(ETWEAVE_DASK_WAIT sets the wait)")
        return list(client.gather(futures))
