"""`simulate` against the protobuf decode of its `.et` files, before and after a change, in one run.

    python -m bench.simulate_floor OUT [OUT ...] [--base REV] [--reps N]

Each OUT is a `convert-run` output folder (e.g. kept from `python -m bench.ranks --generate N` + `convert-run`).
Per folder, interleaved, the mean CPU (user + sys, `os.wait4`: its loading workers' too) and the mean wall time of
`--reps` runs of each whole process, as `bench.ranks` counts its runs: the floor
(`python -m bench.ranks --decode`, the `decode` line of `bench.ranks`), `etweave simulate OUT` and
`etweave simulate OUT --model astra-sim` of the working tree and, with `--base`, of that revision (its own git
worktree, as `bench.identical` checks it out; both trees compiled first). Prints simulate / decode for each model
and whether the base's and the working tree's stdout are byte for byte the same; then, per folder and command, the
CPU per rank net of the command's start-up (its CPU on the start-up run cut from the first folder,
`bench.ranks.startup_run`, as `bench.ranks` measures it, timed alike), and its max/min over the folders (flat
per-rank cost: issue 15's target <= 1.3), and each command's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import launch
from bench.identical import checkout
from bench.ranks import startup_run

REPO = Path(__file__).resolve().parents[1]


def _cpu(tree: Path, cmd: list[str], stdout: Path) -> tuple[float, float, float]:
    """CPU seconds (its waited-for children's too: simulate's loading workers), peak RSS (MiB) and wall seconds of
    one whole process run from `tree` (its imports too); its stdout into `stdout`."""
    done = launch.run(cmd, tree, {**os.environ, "PYTHONPATH": str(tree)}, stdout)
    if done.rc:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.rc}: {done.err}")
    return done.cpu_s, done.rss_kib / 1024, done.wall_s


def measure(out: Path, trees: dict[str, Path], reps: int, work: Path,
            rss: dict[str, float] | None = None, walls: dict[str, float] | None = None) -> dict[str, float]:
    """Mean CPU of each command's runs on folder `out` (the mean, as `bench.ranks` counts); with `rss`, each
    command's largest peak RSS (MiB) is put there, with `walls` its mean wall seconds."""
    files = [str(p) for p in sorted(out.glob("trace.*.et"))]
    commands: dict[str, tuple[Path, list[str]]] = {"decode": (REPO, [sys.executable, "-m", "bench.ranks", "--decode",
                                                                     *files])}
    for side, tree in trees.items():
        commands[f"default {side}"] = (tree, [sys.executable, "-m", "etweave", "simulate", str(out)])
        commands[f"astra-sim {side}"] = (tree, [sys.executable, "-m", "etweave", "simulate", str(out), "--model",
                                                "astra-sim"])
    runs: dict[str, list[float]] = {name: [] for name in commands}
    wall_runs: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(reps):
        for name, (tree, cmd) in commands.items():
            cpu, peak, wall = _cpu(tree, cmd, work / name.replace(" ", "_"))
            runs[name].append(cpu)
            wall_runs[name].append(wall)
            if rss is not None:
                rss[name] = max(rss.get(name, 0.0), peak)
    if walls is not None:
        walls.update({name: statistics.mean(w) for name, w in wall_runs.items()})
    return {name: statistics.mean(cpus) for name, cpus in runs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.simulate_floor", description=__doc__.splitlines()[0])
    p.add_argument("outs", type=Path, nargs="+", metavar="OUT", help="convert-run output folders")
    p.add_argument("--base", metavar="REV", help="also time this revision's simulate (a git worktree of it)")
    p.add_argument("--reps", type=int, default=3, help="runs of each command, their mean counts (default 3)")
    args = p.parse_args(argv)
    launch.start()  # while this process is small: it reads the start-up run's source whole (`bench.launch`)
    work = Path(tempfile.mkdtemp(prefix="etweave-simfloor-"))
    trees = {"head": REPO}
    try:
        if args.base:
            trees = {"base": checkout(args.base, work / "base-tree"), **trees}
        for tree in trees.values():  # compiled as the working tree is (else a side recompiles in every process
            # where PYTHONDONTWRITEBYTECODE is set)
            subprocess.run([sys.executable, "-m", "compileall", "-q", "etweave", "bench"], cwd=tree, check=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                           stdout=subprocess.DEVNULL)
        print(f"load average {os.getloadavg()[0]:.2f} at the start; mean CPU s of {args.reps} runs", flush=True)
        cut = work / "startup"
        startup_run(args.outs[0], cut)
        startup = measure(cut, trees, args.reps, work)
        print(f"start-up (the start-up run of {args.outs[0].name}): "
              + ", ".join(f"{name} {cpu:.2f} s" for name, cpu in startup.items()),
              flush=True)
        per_rank: dict[str, list[float]] = {}
        for out in args.outs:
            peaks: dict[str, float] = {}
            walls: dict[str, float] = {}
            mean = measure(out, trees, args.reps, work, peaks, walls)
            d = mean["decode"]
            ranks = len(list(out.glob("trace.*.et")))
            for name, cpu in mean.items():
                per_rank.setdefault(name, []).append((cpu - startup[name]) / ranks)
            same = ""
            if "base" in trees:
                same = "; stdout base == head: " + str(all(
                    (work / f"{m}_base").read_bytes() == (work / f"{m}_head").read_bytes()
                    for m in ("default", "astra-sim")))
            ratios = ", ".join(f"{name} {cpu:.2f} s = {cpu / d:.2f}x" for name, cpu in mean.items() if name != "decode")
            print(f"{out.name} ({ranks} ranks): decode {d:.2f} s; {ratios}{same}", flush=True)
            print(f"  wall: decode {walls['decode']:.2f} s; " + ", ".join(
                f"{name} {w:.2f} s = {w / walls['decode']:.2f}x" for name, w in walls.items() if name != "decode"),
                flush=True)
            print("  cpu per rank net of start-up: " + ", ".join(
                f"{name} {cpu[-1] * 1e3:.1f} ms" for name, cpu in per_rank.items()), flush=True)
            et_mib = sum(p.stat().st_size for p in out.glob("trace.*.et")) / 2**20
            print("  peak RSS: " + ", ".join(f"{name} {peak:.0f} MiB" for name, peak in peaks.items())
                  + f" (2 x the .et files + 200 MiB = {2 * et_mib + 200:.0f} MiB)", flush=True)
        if len(args.outs) > 1:
            print("cpu per rank net of start-up, max/min over the folders [target <= 1.3]: " + ", ".join(
                f"{name} {max(cpu) / min(cpu):.2f}" for name, cpu in per_rank.items() if min(cpu) > 0))
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
    finally:
        if "base" in trees:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees["base"])], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
