"""Time `etweave convert` against the floor (read + gunzip + orjson.loads) on real and scaled traces.

    python -m bench.run [--quick] [--save] [--gzip] [--only linear,resnet,...]

Every measurement is a whole process, timed from spawn to exit, with its peak RSS from os.wait4. See
bench/README.md for the columns and the targets.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import launch
from bench.scale import traces_dir

REPO = Path(__file__).resolve().parents[1]
FLOOR = Path(__file__).with_name("floor.py")
TARGET_BYTES = 10**9  # "1 GB" of uncompressed Kineto
DISK_MARGIN = 2 * TARGET_BYTES  # the 1 GB pair, its .et output and slack
TRIES, TRIES_HUGE = 3, 1


@dataclass(slots=True)
class Proc:
    wall_s: float
    cpu_s: float  # user + sys: less sensitive than wall time to other processes on a shared machine
    rss_kib: int
    rc: int
    err: str


def run_proc(cmd: list[str], cwd: Path) -> Proc:
    """Run cmd to completion from the launcher (`bench.launch`: its peak RSS its own, not this process's); wall
    clock from spawn to exit, CPU and ru_maxrss of that process (os.wait4)."""
    done = launch.run(cmd, cwd)
    return Proc(done.wall_s, done.cpu_s, done.rss_kib, done.rc, done.err)


@dataclass(slots=True)
class Row:
    case: str
    input_bytes: int = 0  # uncompressed, all files of the case
    events: int = 0  # Kineto traceEvents + host ET nodes
    floor_s: float | None = None
    convert_s: float | None = None
    floor_cpu_s: float | None = None
    convert_cpu_s: float | None = None
    floor_rss_mb: float | None = None
    convert_rss_mb: float | None = None
    rss_over_input: float | None = None  # convert peak RSS / its own pair's input; the worst rank
    note: str = ""
    reports: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return self.convert_s / self.floor_s if self.convert_s and self.floor_s else None

    @property
    def us_per_event(self) -> float | None:
        return self.convert_s / self.events * 1e6 if self.convert_s and self.events else None

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("reports")
        d.update(ratio=self.ratio, us_per_event=self.us_per_event,
                 device_ops=[r.get("device_ops") for r in self.reports],
                 host_ops=[r.get("host_ops") for r in self.reports])
        return d


@dataclass(slots=True)
class Pair:
    host: Path | None
    kineto: Path

    @property
    def files(self) -> list[Path]:
        return [f for f in (self.host, self.kineto) if f is not None]


def convert_cmd() -> list[str]:
    script = Path(sys.executable).with_name("etweave")  # the console script next to this interpreter
    return [str(script)] if script.exists() else [sys.executable, "-m", "etweave"]


def child_json(cmd: list[str]) -> Any:
    """The JSON a helper process prints: parsing and generating happen in children to keep this process small."""
    out = subprocess.run(cmd, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed: {out.stderr.decode(errors='replace')[-500:]}")
    return orjson.loads(out.stdout.splitlines()[-1])


def measure(row: Row, pairs: list[Pair], work: Path, tries: int, counted: bool = False) -> Row:
    """Best-of-`tries` floor and convert for the case (the sum over its pairs, one pair per rank)."""
    if counted:
        pair_bytes = [row.input_bytes]
    else:
        stats = [child_json([sys.executable, str(FLOOR), "--stats", *map(str, p.files)]) for p in pairs]
        pair_bytes = [s["bytes"] for s in stats]
        row.input_bytes, row.events = sum(pair_bytes), sum(s["events"] for s in stats)
    floors, converts, floor_cpus, convert_cpus = [], [], [], []
    floor_rss = convert_rss = 0
    rss_ratio = 0.0
    for _ in range(tries):
        t = cpu = 0.0
        for p in pairs:
            r = run_proc([sys.executable, str(FLOOR), *map(str, p.files)], REPO)
            if r.rc != 0:
                row.note = f"floor failed (rc {r.rc}): {r.err.splitlines()[-1] if r.err else ''}"
                return row
            t, cpu = t + r.wall_s, cpu + r.cpu_s
            floor_rss = max(floor_rss, r.rss_kib)
        floors.append(t)
        floor_cpus.append(cpu)
    row.floor_s, row.floor_cpu_s, row.floor_rss_mb = min(floors), min(floor_cpus), floor_rss / 1024
    for _ in range(tries):
        t = cpu = 0.0
        reports = []
        for n, p in enumerate(pairs):
            out, rep = work / f"out{n}.et", work / f"report{n}.json"
            cmd = [*convert_cmd(), "convert", "--device", str(p.kineto), "-o", str(out), "--report", str(rep),
                   "--quiet"]
            if p.host is not None:
                cmd[2:2] = ["--host", str(p.host)]
            r = run_proc(cmd, REPO)
            if r.rc != 0:
                row.note = f"convert failed (rc {r.rc}): {r.err.splitlines()[-1] if r.err else ''}"
                return row
            t, cpu = t + r.wall_s, cpu + r.cpu_s
            convert_rss = max(convert_rss, r.rss_kib)
            rss_ratio = max(rss_ratio, r.rss_kib * 1024 / pair_bytes[n])
            reports.append(orjson.loads(rep.read_bytes()))
            out.unlink(missing_ok=True)
        converts.append(t)
        convert_cpus.append(cpu)
        row.reports = reports
    row.convert_cpu_s = min(convert_cpus)
    row.convert_s, row.convert_rss_mb, row.rss_over_input = min(converts), convert_rss / 1024, rss_ratio
    dev_in = sum(r["device_ops"]["input"] for r in row.reports)
    dev_out = sum(r["device_ops"]["output"] for r in row.reports)
    row.note = f"device ops out/in {dev_out}/{dev_in}"
    return row


def real_pairs(name: str) -> list[Pair]:
    """The pair of a gpu/ case, or one pair per rank folder (dlrm-8rank)."""
    d = traces_dir() / name
    if (d / "kineto.json.gz").exists():
        return [Pair(d / "host.json.gz", d / "kineto.json.gz")]
    return [Pair(r / "host.json.gz", r / "kineto.json.gz") for r in sorted(d.iterdir()) if r.is_dir()]


def scaled_case(work: Path, row: Row, compress: bool, k: int | None = None, target: int | None = None) -> list[Pair]:
    t0 = time.perf_counter()
    size = ["--k", str(k)] if k is not None else ["--target-bytes", str(target)]
    sp = child_json([sys.executable, "-m", "bench.scale", *size, "--out", str(work / "scaled"),
                     *(["--gzip"] if compress else [])])
    row.case = f"linear x{sp['k']}"
    row.input_bytes = sp["host_bytes"] + sp["kineto_bytes"]
    row.events = sp["host_nodes"] + sp["kineto_events"]
    print(f"  generated {row.case}: {sp['kineto_bytes'] / 1e6:.0f} MB Kineto in {time.perf_counter() - t0:.1f} s",
          flush=True)
    return [Pair(Path(sp["host"]), Path(sp["kineto"]))]


def fmt(v: float | int | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


HEADER = (f"{'case':<20} {'input MB':>9} {'events':>10} {'floor s':>8} {'convert s':>9} {'ratio':>6} "
          f"{'us/event':>8} {'floor RSS MB':>12} {'convert RSS MB':>14} {'RSS/input':>9} {'cpu s f/c':>13}  note")


def line(r: Row) -> str:
    return (f"{r.case:<20} {fmt(r.input_bytes / 1e6, '9.1f')} {r.events:>10} {fmt(r.floor_s, '8.2f')} "
            f"{fmt(r.convert_s, '9.2f')} {fmt(r.ratio, '6.2f')} {fmt(r.us_per_event, '8.2f')} "
            f"{fmt(r.floor_rss_mb, '12.0f')} {fmt(r.convert_rss_mb, '14.0f')} {fmt(r.rss_over_input, '9.2f')} "
            f"{fmt(r.floor_cpu_s, '6.2f')}/{fmt(r.convert_cpu_s, '<6.2f')}  {r.note}")


def _run_case(name: str, make: Callable[[Row], list[Pair]], tries: int, work: Path) -> Row:
    """One case's row: its pairs made (a generator failure costs this case, not the run) and measured."""
    row = Row(name)
    try:
        pairs = make(row)
    except RuntimeError as exc:
        row.note = str(exc).splitlines()[0]
        return row
    measure(row, pairs, work, tries, counted=name.startswith("linear"))
    if name.startswith("kineto-only") and row.convert_s is None and row.note.startswith("convert failed"):
        row.note = "kineto-only: not supported yet"
    shutil.rmtree(work / "scaled", ignore_errors=True)  # disk: one scaled pair at a time
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="skip the >= 1 GB scaled trace")
    p.add_argument("--save", action="store_true", help="write the table to bench/results.json")
    p.add_argument("--gzip", action="store_true", help="write the scaled traces gzip-compressed (level 1)")
    p.add_argument("--only", help="comma-separated substrings of case names to run (default: all)")
    args = p.parse_args(argv)
    launch.start()  # while this process is small (`bench.launch`)
    if not traces_dir().is_dir():
        print(f"no traces at {traces_dir()} (set ETWEAVE_TRACES)", file=sys.stderr)
        return 2
    wanted = args.only.split(",") if args.only else None
    rows: list[Row] = []
    notes: list[str] = []
    print(f"etweave convert = {' '.join(convert_cmd())}; python {platform.python_version()}; "
          f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} (other processes skew the times)", flush=True)
    with tempfile.TemporaryDirectory(prefix="etweave-bench-") as tmp:
        work = Path(tmp)
        cases: list[tuple[str, Callable[[Row], list[Pair]], int]] = [
            ("gpu/linear", lambda _: real_pairs("gpu/linear"), TRIES),
            ("gpu/resnet", lambda _: real_pairs("gpu/resnet"), TRIES),
            ("gpu/dlrm-8rank", lambda _: real_pairs("gpu/dlrm-8rank"), TRIES),
            ("linear x1", lambda row: scaled_case(work, row, args.gzip, k=1), TRIES),
            ("linear x10", lambda row: scaled_case(work, row, args.gzip, k=10), TRIES),
        ]
        if args.quick:
            notes.append("--quick: skipped the scaled linear trace of >= 1 GB uncompressed Kineto")
        else:
            cases.append(("linear 1GB", lambda row: scaled_case(work, row, args.gzip, target=TARGET_BYTES),
                          TRIES_HUGE))
        cases.append(("kineto-only/allreduce", lambda _: [Pair(None, traces_dir() / "kineto-only"
                                                               / "allreduce-2020.json.gz")], TRIES))
        print(HEADER, flush=True)
        for name, make, tries in cases:
            if wanted and not any(w in name for w in wanted):
                continue
            if name == "linear 1GB" and shutil.disk_usage(tmp).free < DISK_MARGIN:
                notes.append(f"skipped {name}: less than {DISK_MARGIN / 1e9:.0f} GB free in {tmp}")
                continue
            row = _run_case(name, make, tries, work)
            rows.append(row)
            print(line(row), flush=True)
    scaled = [r for r in rows if r.case.startswith("linear x") and r.us_per_event]
    spread = None
    if len(scaled) >= 2:
        costs = [r.us_per_event for r in scaled if r.us_per_event]
        spread = max(costs) / min(costs)
        print(f"per-event cost across {len(scaled)} scaled sizes ({', '.join(r.case for r in scaled)}): "
              f"max/min = {spread:.2f}")
    notes.append(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for n in notes:
        print(n)
    if args.save:
        out = Path(__file__).with_name("results.json")
        out.write_bytes(orjson.dumps({
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
            "cpus": os.cpu_count(), "quick": args.quick, "gzip_scaled": args.gzip, "notes": notes,
            "per_event_spread": spread,
            "rows": [r.as_json() for r in rows]}, option=orjson.OPT_INDENT_2) + b"\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
