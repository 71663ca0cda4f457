"""Record a run folder that `etweave convert-run` reads: `run_dir/rank<R>/host.json.gz` (host execution trace)
and `run_dir/rank<R>/kineto.json.gz` (Kineto trace), both from ONE profiler session so that `Record function id`
links them.

    from etweave.collect import collect

    with collect("run", steps=3) as c:          # rank from torch.distributed when it is initialized
        for batch in loader:
            train_step(batch)
            c.step()                             # once per training step, at its end
            if c.done:                           # the recorded window is written; later steps run unprofiled
                break

The host ET observer is started and stopped by the profiler schedule (wait, warmup, active steps), so it runs
over whole steps only: an observer stopped in the middle of a step leaves that step's ops as orphans.

torch is imported only when `collect` is used: the converter itself never needs it (`pip install etweave[collect]`).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST_NAME = "host.json.gz"
KINETO_NAME = "kineto.json.gz"
# The annotation `collect` wraps each process-group call in: gloo records no group for a collective anywhere
# else (no record_param_comms), and subgroup collectives need it (etweave.collectives reads it).
PG_ANNOTATION = "## etweave:process_group {} ##"
_PG_METHODS = ("allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "all_gather_single",
               "all_gather_single_coalesced", "_allgather_base", "allgather_into_tensor_coalesced",
               "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced", "_reduce_scatter_base",
               "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "all_to_all_single", "broadcast",
               "reduce", "gather", "scatter", "barrier", "send", "recv", "recv_anysource")
_INSTALL_HINT = "etweave.collect needs PyTorch: pip install etweave[collect]"


def _torch() -> Any:
    try:
        import torch
        import torch.profiler  # the submodule is not loaded by `import torch` alone
    except ImportError as exc:  # the converter runs without torch; only collecting needs it
        raise ImportError(_INSTALL_HINT) from exc
    return torch


def resolve_rank(rank: int | None = None) -> int:
    """The global rank from torch.distributed when it is initialized, else `rank`, else 0."""
    torch = _torch()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0 if rank is None else int(rank)


def rank_dir(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}"


@dataclass
class Collector:
    """Handle yielded by `collect`: call `step()` once at the end of every training step."""

    run_dir: Path
    rank: int
    wait: int
    warmup: int
    active: int
    profiler: Any = field(default=None, repr=False)  # the torch.profiler.profile (e.g. to add metadata)
    observer: Any = field(default=None, repr=False)  # the ExecutionTraceObserver attached to it
    steps_done: int = 0
    saved: bool = False
    aborted: bool = False

    @property
    def host_path(self) -> Path:
        return rank_dir(self.run_dir, self.rank) / HOST_NAME

    @property
    def kineto_path(self) -> Path:
        return rank_dir(self.run_dir, self.rank) / KINETO_NAME

    @property
    def total_steps(self) -> int:
        """Steps to run for the recorded window to be complete (wait + warmup + active)."""
        return self.wait + self.warmup + self.active

    @property
    def done(self) -> bool:
        """True once both files are written; steps after that are not profiled."""
        return self.saved

    def step(self) -> None:
        """Mark a step boundary. The profiler starts and stops both traces only here (and at the exit of
        `collect`), never inside a step."""
        self.steps_done += 1
        self.profiler.step()


@contextlib.contextmanager
def _annotate_process_groups(torch: Any) -> Iterator[None]:
    """Every call of a ProcessGroup collective method from Python (torch.distributed's functions, DeviceMesh)
    runs inside a `## etweave:process_group <group name> ##` record_function, so both traces say which group it
    used. Calls made from C++ (DDP's reducer) are not annotated; their group comes from the other evidence."""
    dist = torch.distributed
    group_class = getattr(dist, "ProcessGroup", None) if dist.is_available() else None
    if group_class is None:
        yield
        return
    record_function = torch.profiler.record_function
    originals = {name: getattr(group_class, name) for name in _PG_METHODS if hasattr(group_class, name)}
    # restored from the class's own dict: pybind methods read back with getattr no longer bind `self`
    own = {name: vars(group_class).get(name) for name in originals}

    def wrap(method: Any) -> Any:
        def annotated(self: Any, *args: Any, **kwargs: Any) -> Any:
            with record_function(PG_ANNOTATION.format(getattr(self, "group_name", ""))):
                return method(self, *args, **kwargs)
        return annotated

    for name, method in originals.items():
        setattr(group_class, name, wrap(method))
    try:
        yield
    finally:
        for name, raw in own.items():
            if raw is None:
                delattr(group_class, name)  # it was inherited
            else:
                setattr(group_class, name, raw)


def _tmp(path: Path, suffix: str = ".json.gz") -> Path:
    # Written beside the final file, renamed into place when complete: a crashed run leaves no half trace
    # under the names convert-run reads. torch gzips the Kineto export because the name ends in .gz.
    return path.with_name(f".{path.name.removesuffix('.json.gz')}.tmp-{os.getpid()}{suffix}")


def _gzip(src: Path, dst: Path) -> None:
    with open(src, "rb") as fin, gzip.open(dst, "wb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


@contextlib.contextmanager
def collect(run_dir: str | os.PathLike[str], rank: int | None = None, *, steps: int = 3, wait: int = 0,
            warmup: int = 1, record_shapes: bool = True) -> Iterator[Collector]:
    """Profile `steps` training steps (after `wait` unprofiled and `warmup` warm-up steps) of this rank into
    `run_dir/rank<R>/{host,kineto}.json.gz`.

    One `torch.profiler.profile` session with the `ExecutionTraceObserver` attached (so host ET `rf_id` ==
    Kineto `Record function id`), `record_shapes`, all threads profiled (gloo workers, autograd, user threads),
    and on CUDA machines GPU activities with CUDA synchronization events. One window only (repeat=1): the host ET
    observer writes one file and must see one contiguous window.

    The rank is `torch.distributed.get_rank()` when a process group is initialized, else `rank`, else 0. Leaving
    the block inside the window writes the steps recorded so far; leaving it before the window raises
    RuntimeError; an exception raised in the block propagates and nothing is written. Inside the block, every
    torch.distributed collective called from Python runs inside a `## etweave:process_group <name> ##`
    record_function, which tells the converter its process group (gloo records it nowhere else).
    """
    if steps < 1 or wait < 0 or warmup < 0:
        raise ValueError(f"need steps >= 1, wait >= 0, warmup >= 0 (got steps={steps}, wait={wait}, warmup={warmup})")
    torch = _torch()
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    r = resolve_rank(rank)
    out = rank_dir(run_dir, r)
    out.mkdir(parents=True, exist_ok=True)
    host, kineto = out / HOST_NAME, out / KINETO_NAME
    # The ET observer writes plain JSON here; we gzip it ourselves (torch would print a line on stdout doing so).
    host_raw, host_tmp, kineto_tmp = _tmp(host, ".json"), _tmp(host), _tmp(kineto)

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # profile_all_threads: the ET observer's callbacks are global, so Kineto must see every thread too,
    # or ops on gloo worker / user threads have no measured time.
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True, enable_cuda_sync_events=cuda)
    collector = Collector(Path(run_dir), r, wait, warmup, steps)
    observer = ExecutionTraceObserver().register_callback(str(host_raw))
    if not observer.is_registered:
        raise RuntimeError("etweave.collect: could not register the ExecutionTraceObserver (only one can be "
                           "registered per process; is another one, e.g. ENABLE_PYTORCH_EXECUTION_TRACE, active?)")

    def on_trace_ready(prof: Any) -> None:
        if collector.aborted:
            return
        prof.export_chrome_trace(str(kineto_tmp))
        # Finalize the host ET now, not at the profiler's exit: the files are complete as soon as `done` says so,
        # however many steps the caller runs after the window.
        observer.unregister_callback()
        _gzip(host_raw, host_tmp)
        host_raw.unlink()
        os.replace(kineto_tmp, kineto)
        os.replace(host_tmp, host)
        collector.saved = True

    prof = profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=on_trace_ready,
        record_shapes=record_shapes,
        experimental_config=config,
        execution_trace_observer=observer,
    )
    collector.profiler, collector.observer = prof, observer
    prof.start()
    try:
        with _annotate_process_groups(torch):
            yield collector
    except BaseException:
        collector.aborted = True  # a step that raised is no step boundary: write nothing
        raise
    finally:
        # Exiting stops at the current step boundary; inside the active window it saves what was recorded.
        prof.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # torch leaves profile.__exit__ unannotated
        observer.unregister_callback()  # no-op when on_trace_ready finalized it
        for tmp in (host_raw, host_tmp, kineto_tmp):
            tmp.unlink(missing_ok=True)
    if not collector.saved:
        raise RuntimeError(f"etweave.collect: {collector.steps_done} step(s) ran, but the schedule records from "
                           f"step {wait + warmup + 1} (wait={wait}, warmup={warmup}): nothing was written; call "
                           f"step() once per training step, {collector.total_steps} times in all")
