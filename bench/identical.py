"""Show that a change of structure changed no output: run every conversion (and the replays of the results) on
every shared trace with two revisions of etweave, and compare the files byte by byte.

    python -m bench.identical --base REV [--head REV] [--quick] [--keep DIR]

`--base` and `--head` are git revisions (default head: the working tree as it is, uncommitted edits included).
Each revision runs from its own checkout (`git worktree`), so the two never share an import. Every output file,
the stdout of each command and its exit status are compared. Exit 0 when all are identical, 1 when any differs
(each difference is named). `--quick` leaves out the three largest traces (allreduce-2020, linear, resnet).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.scale import traces_dir

REPO = Path(__file__).resolve().parents[1]
LARGE = ("allreduce-2020", "gpu-linear", "gpu-resnet")


def cases(traces: Path) -> Iterator[tuple[str, list[list[str]]]]:
    """(case name, commands). Each command is etweave's arguments; `{out}` is the case's output folder."""
    for pair in sorted((traces / "gpu").iterdir()):
        if (pair / "host.json.gz").exists():
            name = f"gpu-{pair.name}"
            yield name, [["convert", "--host", str(pair / "host.json.gz"), "--device", str(pair / "kineto.json.gz"),
                          "-o", "{out}/rank0.et", "--report", "{out}/report.json"],
                         ["simulate", "{out}/rank0.et"], ["simulate", "--model", "astra-sim", "{out}/rank0.et"]]
    for trace in sorted((traces / "kineto-only").glob("*.json.gz")):
        name = trace.name.removesuffix(".json.gz")
        yield name, [["convert", "--device", str(trace), "-o", "{out}/rank.et", "--report", "{out}/report.json"],
                     ["simulate", "{out}/rank.et"]]
    for trace in sorted((traces / "host-only").glob("*.json.gz")):
        name = "host-" + trace.name.removesuffix(".json.gz")
        yield name, [["convert", "--host", str(trace), "-o", "{out}/rank.et", "--report", "{out}/report.json"],
                     ["simulate", "{out}/rank.et"]]
    runs = [traces / "gpu" / "dlrm-8rank", *sorted(p for p in (traces / "cpu-gloo").iterdir() if p.is_dir())]
    for run in runs:
        yield f"run-{run.name}", [
            ["convert-run", str(run), "-o", "{out}/et"],
            ["check", "{out}/et"],
            ["simulate", "{out}/et", "--csv", "{out}/nodes.csv", "--steps-csv", "{out}/steps.csv",
             "--timeline", "{out}/timeline.json"],
            ["simulate", "--model", "astra-sim", "{out}/et"],
            ["simulate", "{out}/et", "--scale", "kind=cpu:1.5"],
            ["jsonize", "{out}/et/trace.0.et"],
        ]


def run_case(tree: Path, commands: list[list[str]], out: Path) -> list[str]:
    """Run the case's commands with the etweave of `tree`; return one line per command: its status and stdout's
    hash (stdout itself is kept in the output folder, so a difference can be read)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    lines = []
    for n, args in enumerate(commands):
        argv = [a.replace("{out}", str(out)) for a in args]
        p = subprocess.run([sys.executable, "-m", "etweave", *argv], cwd=tree, env=env, capture_output=True)
        stdout = p.stdout.replace(str(out).encode(), b"{out}")
        (out / f"cmd{n}.stdout").write_bytes(stdout)
        lines.append(f"{' '.join(args)} -> exit {p.returncode}")
        (out / f"cmd{n}.status").write_text(lines[-1] + "\n")
    return lines


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def checkout(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(where), rev], check=True)
    return where


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision whose outputs are the reference")
    ap.add_argument("--head", default=None, help="git revision to compare (default: the working tree)")
    ap.add_argument("--quick", action="store_true", help=f"leave out {', '.join(LARGE)}")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--keep", type=Path, default=None, help="keep both output trees in this folder")
    args = ap.parse_args(argv)
    traces = traces_dir()
    work = Path(tempfile.mkdtemp(prefix="etweave-identical-"))
    trees: dict[str, Path] = {}
    try:
        trees["base"] = checkout(args.base, work / "base-tree")
        trees["head"] = checkout(args.head, work / "head-tree") if args.head else REPO
        only = {c for c in args.only.split(",") if c}
        differ = 0
        total = 0
        for name, commands in cases(traces):
            if (args.quick and name in LARGE) or (only and name not in only):
                continue
            outs = {side: (args.keep or work) / side / name for side in trees}
            status = {side: run_case(tree, commands, outs[side]) for side, tree in trees.items()}
            a, b = digests(outs["base"]), digests(outs["head"])
            diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            total += len(a)
            differ += len(diff)
            failed = [s for s in status["head"] if not s.endswith("exit 0")]
            print(f"{name:32} {len(a):3} files  {'identical' if not diff else 'DIFFERENT: ' + ', '.join(diff)}"
                  + (f"  (non-zero: {'; '.join(failed)})" if failed else ""), flush=True)
        print(f"{total} files compared, {differ} differ: base {args.base}, head {args.head or 'working tree'}")
        return 1 if differ else 0
    finally:
        for side in ("base", "head"):
            if side in trees and trees[side] != REPO:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees[side])])
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
