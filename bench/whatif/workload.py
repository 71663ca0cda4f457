"""The A/B workloads of the what-if benchmark, recorded with `etweave.collect` on CPU with gloo.

    python -m bench.whatif.workload OUT_DIR [--repeats N] [--steps S] [--pairs a,b,...]

writes OUT_DIR/<pair>/<side>/r<k>/rank<R>/{host,kineto}.json.gz for side A and B of every pair and every repeat k.
Both ranks run every recording in one process each (one `torch` import and one process group for the whole
set), alternating A and B within each repeat so that slow drift of the machine hits both sides alike.

Run B of each pair differs from run A in one op (a `record_function` or one aten op); PAIRS says which, how much,
and which what-if edit (`etweave simulate` options, `etweave.simulate.whatif`) predicts B from A's files. Work
that is not the point of a pair is `time.sleep` inside a `record_function`, so that the pairs do not depend on
how busy the 2 CPU cores are; the compute pair uses a real `aten::bmm`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

WORLD = 2
WAIT, WARMUP = 1, 1  # the first step of a process warms gloo up: keep it out of the recorded window
MS = 1e-3


@dataclass(frozen=True)
class Pair:
    """One A/B pair. `edits(steps, stretch)` are the what-if edits (CLI syntax) that turn A's graph into B;
    `steps` are the ProfilerStep numbers recorded, `stretch` the run's time stretch. `control`: B's span is not
    expected to move."""

    name: str
    what: str
    control: bool
    edits: Callable[[list[int], float], list[tuple[str, str]]]


# --------------------------------------------------------------------------------------------- the steps
# Every step function runs one training-like step on one rank: (rank, step number, side "A"/"B").

STRAGGLE_BASE_MS, STRAGGLE_EXTRA_MS = 1.0, 25.0
HIDDEN_SLOW_MS, HIDDEN_EXTRA_MS = 30.0, 15.0
HELPER_A_MS, HELPER_B_MS, HELPER_MAIN_MS = 12.0, 37.0, 10.0
HELPER_HIDDEN_A_MS, HELPER_HIDDEN_B_MS, HELPER_HIDDEN_MAIN_MS = 2.0, 8.0, 20.0
# async_allreduce: 32 -> 128 MB, sizes that do not follow --stretch. gloo's all_reduce time is far from proportional
# to the bytes below about 16 MB (measured under the profiler: 8 -> 32 MB took 3.2x, 4 -> 16 MB 2.7x), which the
# bandwidth edit cannot know from A's one size; 32 -> 128 MB took 3.8x. Long sleeps around it (ASYNC_FRAME_MS):
# the transfer's time follows the memory traffic of the whole machine, which SCHED_FIFO does not keep away
ASYNC_NUMEL, ASYNC_FACTOR, ASYNC_OVERLAP_MS, ASYNC_FRAME_MS = 1 << 23, 4, 2.0, 25.0
ASYNC_HIDDEN_NUMEL, ASYNC_HIDDEN_FACTOR, ASYNC_HIDDEN_OVERLAP_MS = 1 << 20, 2, 40.0  # 4 -> 8 MB (x stretch)
# compute4x: (N x K) @ (K x N), B's K 4x A's: 4x the work (about 9 -> 36 ms here, under the profiler). Large, so
# that the op's fixed cost (about 0.4 ms after a sleep, measured) is small beside it
MM_N, MM_K, MM_FACTOR = 256, 8192, 4
BG_TICK_MS, BG_PAUSE_MS = 0.5, 4.0
POLICY_FILE = "policy.json"  # {"realtime": bool}: whether the recorded steps ran under SCHED_FIFO
FRAME_MS = 5.0  # fixed work before and after the interesting part of every step
# compute4x: the changed op's time varies with the memory traffic of the whole machine (SCHED_FIFO keeps other
# processes off the core, not off the memory bus); longer sleeps around it make B's span vary less
LONG_FRAME_MS = 15.0
# --stretch: every sleep, the async all_reduce's size and the bmm's batch times this (longer steps: less noise)
_STRETCH = [1.0]


def stretched(ms: float, stretch: float | None = None) -> float:
    return ms * (_STRETCH[0] if stretch is None else stretch)


def _torch():  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    return torch, dist, record_function


def _work(name: str, ms: float) -> None:
    """Work the profiler sees as one op named `name` lasting `ms` (a sleep: independent of CPU load)."""
    _, _, record_function = _torch()
    with record_function(name):
        time.sleep(stretched(ms) * MS)


_TENSORS: dict[tuple[str, int], object] = {}


def _tensor(kind: str, numel: int):  # type: ignore[no-untyped-def]
    """Tensors are made once per process: allocating (and page-faulting) 16 MB in B but not in A would be a
    second difference between the runs."""
    torch, _, _ = _torch()
    key = (kind, numel)
    if key not in _TENSORS:
        _TENSORS[key] = torch.ones(numel) if kind == "ones" else torch.zeros(numel) if kind == "zeros" else \
            torch.randn(numel)  # any other kind: random, one tensor per kind
    return _TENSORS[key]


def _all_reduce_small() -> None:
    _, dist, _ = _torch()
    dist.all_reduce(_tensor("ones", 256))


def step_straggler(rank: int, step: int, side: str) -> None:
    """Before a synchronous all_reduce, `straggle` lasts 1 ms; in B, the rank `step % 2` straggles 25 ms more."""
    _work("frame_before", FRAME_MS)
    slow = side == "B" and rank == step % WORLD
    _work("straggle", STRAGGLE_BASE_MS + (STRAGGLE_EXTRA_MS if slow else 0.0))
    _all_reduce_small()
    _work("frame_after", FRAME_MS)


def step_straggler_hidden(rank: int, step: int, side: str) -> None:
    """Control: rank 1 always spends 30 ms in `slow_rank` before the all_reduce; in B rank 0's `straggle` grows
    by 15 ms, still shorter than rank 1's wait, so the step does not move. Rank 0 also has a background thread
    ticking on its own (`bg_tick`), which waits for nothing of the main thread after it started."""
    stop = threading.Event()

    def background() -> None:
        while not stop.is_set():
            _work("bg_tick", BG_TICK_MS)
            time.sleep(stretched(BG_PAUSE_MS) * MS)

    bg = threading.Thread(target=background, name="bg") if rank == 0 else None
    if bg is not None:
        bg.start()
    _work("frame_before", FRAME_MS)
    if rank == 1:
        _work("slow_rank", HIDDEN_SLOW_MS)
    _work("straggle", STRAGGLE_BASE_MS + (HIDDEN_EXTRA_MS if side == "B" and rank == 0 else 0.0))
    _all_reduce_small()
    _work("frame_after", FRAME_MS)
    if bg is not None:
        stop.set()
        bg.join()


def _helper_step(side: str, a_ms: float, b_ms: float, main_ms: float) -> None:
    helper = threading.Thread(target=_work, args=("helper_work", b_ms if side == "B" else a_ms), name="helper")
    _work("frame_before", FRAME_MS)
    helper.start()
    _work("main_work", main_ms)
    helper.join()
    _all_reduce_small()
    _work("frame_after", FRAME_MS)


def step_helper_join(rank: int, step: int, side: str) -> None:
    """A helper thread's `helper_work` (12 ms in A, 37 ms in B) runs beside 10 ms of `main_work`, then is joined:
    the main thread already waits in A's join (2 ms), so A's trace holds the evidence of the join. (A join that
    never waited in A leaves no trace of itself in A; `helper_hidden` is that case.)"""
    _helper_step(side, HELPER_A_MS, HELPER_B_MS, HELPER_MAIN_MS)


def step_helper_hidden(rank: int, step: int, side: str) -> None:
    """Control: `helper_work` grows from 2 to 8 ms, still hidden behind 20 ms of `main_work`."""
    _helper_step(side, HELPER_HIDDEN_A_MS, HELPER_HIDDEN_B_MS, HELPER_HIDDEN_MAIN_MS)


def _async_step(side: str, numel: int, factor: int, overlap_ms: float, frame_ms: float) -> None:
    _, dist, _ = _torch()
    grad = _tensor("ones", numel * (factor if side == "B" else 1))
    _work("frame_before", frame_ms)
    work = dist.all_reduce(grad, async_op=True)
    _work("overlap_work", overlap_ms)
    work.wait()
    _work("frame_after", frame_ms)


def step_async_allreduce(rank: int, step: int, side: str) -> None:
    """An async all_reduce overlapped with 2 ms of `overlap_work`, then waited for; B's tensor is 4x larger. The
    32 MB transfer of A already outlasts the overlap, so A's trace shows the wait."""
    _async_step(side, ASYNC_NUMEL, ASYNC_FACTOR, ASYNC_OVERLAP_MS, ASYNC_FRAME_MS)


def step_async_hidden(rank: int, step: int, side: str) -> None:
    """Control: the async all_reduce doubles but stays hidden behind 40 ms of `overlap_work`."""
    _async_step(side, round(stretched(ASYNC_HIDDEN_NUMEL)), ASYNC_HIDDEN_FACTOR, ASYNC_HIDDEN_OVERLAP_MS, FRAME_MS)


def step_compute4x(rank: int, step: int, side: str) -> None:
    """One `aten::mm` on rank 1, (N x K) @ (K x N) with K 4x larger in B (4x the work, the same N x N result),
    before an all_reduce that rank 0 waits in. Its size does not follow --stretch (see MM_K)."""
    torch, _, _ = _torch()
    k = MM_K * (MM_FACTOR if side == "B" else 1)
    a = _tensor("mm_a", MM_N * k).view(MM_N, k)
    b = _tensor("mm_b", k * MM_N).view(k, MM_N)
    out = _tensor("zeros", MM_N * MM_N).view(MM_N, MM_N)  # no allocation inside the op: page faults grow with size
    _work("frame_before", LONG_FRAME_MS)
    if rank == 1:  # one rank computes: two ops at once on 2 shared cores slow each other down unevenly
        torch.mm(a, b, out=out)
    _all_reduce_small()
    _work("frame_after", LONG_FRAME_MS)


STEPS: dict[str, Callable[[int, int, str], None]] = {
    "straggler": step_straggler,
    "straggler_hidden": step_straggler_hidden,
    "helper_join": step_helper_join,
    "helper_hidden": step_helper_hidden,
    "async_allreduce": step_async_allreduce,
    "async_hidden": step_async_hidden,
    "compute4x": step_compute4x,
}


def _us(ms: float, stretch: float) -> int:
    return round(stretched(ms, stretch) * 1000)


PAIRS: dict[str, Pair] = {p.name: p for p in [
    Pair("straggler", "straggler rank alternating per step: `straggle` +25 ms on rank step%2", False,
         lambda steps, x: [("set-duration", f"name=straggle,rank={s % WORLD},step={s}:"
                                            f"{_us(STRAGGLE_BASE_MS + STRAGGLE_EXTRA_MS, x)}") for s in steps]),
    Pair("straggler_hidden", "control: rank 0 `straggle` +15 ms, hidden behind rank 1's 30 ms", True,
         lambda steps, x: [("set-duration", f"name=straggle,rank=0:{_us(STRAGGLE_BASE_MS + HIDDEN_EXTRA_MS, x)}")]),
    Pair("helper_join", "helper thread `helper_work` 12 -> 37 ms, joined after 10 ms of main work", False,
         lambda steps, x: [("set-duration", f"name=helper_work:{_us(HELPER_B_MS, x)}")]),
    Pair("helper_hidden", "control: helper thread `helper_work` 2 -> 8 ms, hidden behind 20 ms", True,
         lambda steps, x: [("set-duration", f"name=helper_work:{_us(HELPER_HIDDEN_B_MS, x)}")]),
    Pair("async_allreduce", "async all_reduce 4x larger (32 -> 128 MB), overlapped with 2 ms then waited for", False,
         lambda steps, x: [("comm-bandwidth", f"{1 / ASYNC_FACTOR:g}")]),
    Pair("async_hidden", "control: async all_reduce 2x larger (4 -> 8 MB), hidden behind 40 ms", True,
         lambda steps, x: [("comm-bandwidth", f"{1 / ASYNC_HIDDEN_FACTOR:g}")]),
    Pair("compute4x", "one `aten::mm` on rank 1 with 4x the inner size; rank 0 waits for it in the all_reduce", False,
         lambda steps, x: [("scale", f"name=aten::mm:{MM_FACTOR}")]),
]}


# --------------------------------------------------------------------------------------------- recording

RT_PRIORITY = 1  # the lowest SCHED_FIFO priority: above every ordinary process, below the kernel's own


def _set_policy(realtime: bool) -> bool:
    """Every thread of this process (gloo's workers included) to SCHED_FIFO, or back to SCHED_OTHER; threads
    started later inherit their starter's policy. False where not permitted (needs root or CAP_SYS_NICE)."""
    policy, prio = (os.SCHED_FIFO, RT_PRIORITY) if realtime else (os.SCHED_OTHER, 0)
    try:
        for tid in os.listdir("/proc/self/task"):
            os.sched_setscheduler(int(tid), policy, os.sched_param(prio))
    except (OSError, AttributeError):  # PermissionError; a thread that ended meanwhile; no such call (not Linux)
        return False
    return True


def _record_one(name: str, side: str, rank: int, out: Path, steps: int, realtime: bool) -> None:
    """One recording. With `realtime`, the steps run under SCHED_FIFO, so that the other processes of a busy
    machine do not preempt them (on 2 shared cores a compute op of a few ms was preempted for 4-10 ms at a time,
    even at nice -20); the profiler writes its files after the last step at the ordinary policy, so that this
    benchmark does not starve the machine for the seconds that takes."""
    from etweave.collect import collect

    step = STEPS[name]
    with collect(out, steps=steps, wait=WAIT, warmup=WARMUP) as c:
        if realtime:
            _set_policy(True)
        try:
            for s in range(c.total_steps - 1):
                step(rank, s, side)
                c.step()
            step(rank, c.total_steps - 1, side)
        finally:
            if realtime:
                _set_policy(False)
        c.step()  # the last step boundary writes the files


def _worker(rank: int, port: int, out: str, pairs: list[str], repeats: int, steps: int, stretch: float,
            realtime: bool) -> None:
    _STRETCH[0] = stretch
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch, dist, _ = _torch()

    torch.set_num_threads(1)  # 2 processes on 2 cores: intra-op threads would only contend
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        for k in range(repeats):
            for name in pairs:
                for side in ("A", "B"):
                    dist.barrier()  # both ranks start each recording together
                    _record_one(name, side, rank, run_dir(Path(out), name, side, k), steps, realtime)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def realtime_permitted() -> bool:
    """Whether this process may run threads under SCHED_FIFO (tried on this thread, then undone)."""
    if not _set_policy(True):
        return False
    return _set_policy(False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(out: Path, pairs: list[str], repeats: int, steps: int, stretch: float = 1.0,
           realtime: bool = True) -> bool:
    """Record every pair's A and B runs `repeats` times under `out` (2 gloo processes). With `realtime`, the
    recorded steps run under SCHED_FIFO where that is permitted. Returns whether they did; also written to
    `out/policy.json`."""
    import torch.multiprocessing as mp

    unknown = sorted(set(pairs) - set(PAIRS))
    if unknown:
        raise ValueError(f"unknown pairs {unknown}; known: {sorted(PAIRS)}")
    out.mkdir(parents=True, exist_ok=True)
    realtime = realtime and realtime_permitted()
    mp.spawn(_worker, args=(_free_port(), str(out), pairs, repeats, steps, stretch, realtime), nprocs=WORLD,
             join=True)
    (out / POLICY_FILE).write_text(json.dumps({"realtime": realtime}))
    return realtime


def run_dir(out: Path, pair: str, side: str, repeat: int) -> Path:
    return out / pair / side / f"r{repeat}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pairs", default=",".join(PAIRS))
    ap.add_argument("--stretch", type=float, default=1.0, help="time stretch of every pair (default 1)")
    ap.add_argument("--no-realtime", action="store_true",
                    help="run the recorded steps at the ordinary scheduling policy, not SCHED_FIFO")
    args = ap.parse_args(argv)
    realtime = record(args.out, args.pairs.split(","), args.repeats, args.steps, args.stretch, not args.no_realtime)
    print(f"recorded steps ran under {'SCHED_FIFO' if realtime else 'the ordinary scheduling policy'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
