"""Synthetic N-rank runs from a real multi-rank run, for the scale benchmark (`python -m bench.ranks`).

Synthetic rank r is a copy of source rank s = r mod S (S: the source run's ranks, 8 for `gpu/dlrm-8rank`), so
rank r sits on "node" r // S with local device r mod S, as a job of N / S such nodes would. Per rank:

- host ET: the source's file byte for byte (it names no rank the converter reads, and its `cuda:<d>` devices are
  already the local device of rank r);
- Kineto: `distributedInfo` says rank r of world size N, with `pg_config` listing the world group ("0", ranks
  0..N-1) and rank r's subgroup (below); every timestamp goes through one affine map per rank, t -> t0 + shift +
  (t - t0) * stretch (shift up to SHIFT_US, stretch within 1 +- STRETCH), so ranks differ in start and speed
  while every event keeps its nesting, order and thread (a monotone map never swaps two instants);
- process groups: the all-reduce kernels are moved to a subgroup of `group_size` consecutive ranks (group
  "1 + r // group_size", `Process Group Name`/`Process Group Ranks` args, as PyTorch writes them on NCCL
  kernels); the all-to-alls stay in the world group. The source's all-reduces have equal sizes on every rank, so
  each subgroup's members issue the same sequence, as the world group's members do for the all-to-alls.

Only the subgroup of rank r (not every subgroup of the job) is listed in its `pg_config`, so each rank's input
has the same size at every N and the per-rank cost can be compared across N.

The second source (`--source gloo`) is a CPU run recorded with `etweave.collect` (`examples/train_gloo.py`: DDP,
every gloo collective and a send/recv pair per step; recorded afresh unless `--source-run` names one). Rank r is a
copy of source rank s = r mod S in block b = r // S (N must be a multiple of S): its host ET's and Kineto trace's
world size become N (`## process_group:init ##`, `distributedInfo`), and every send's and recv's peer p becomes
b * S + p (the host ET's `c10d::send`/`c10d::recv_` peer argument, which the converter reads, and Kineto's
`Concrete Inputs`), so each block's ranks exchange among themselves as the source's did; the collectives stay in
the world group of N ranks. Timestamps are jittered as above, to the ns.

    python -m bench.ranks --generate 32 --out /tmp/run32           # the generator alone
    python -m bench.ranks --generate 16 --source gloo --out /tmp/g16
    python -m bench.ranks --sizes 8,64,256 [--dask 64]              # the N-rank table (bench/README.md)
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.run import run_proc
from bench.scale import load_json, traces_dir
from etweave.read.widths import MAX_RANKS  # the converter's world-size cap: the generator stays within it

REPO = Path(__file__).resolve().parents[1]
SHIFT_US = 20  # largest extra start offset of a rank (collectives must still overlap across members)
STRETCH = 0.0005  # largest relative change of a rank's speed (0.05%: 10 us over dlrm's 20 ms)
GROUP_SIZE = 4
ALL_REDUCE_MARK = "AllReduce"  # NCCL all-reduce kernels: ncclKernel_AllReduce_*, ncclDevKernel_AllReduce_*
SOURCES = ("dlrm", "gloo")
GLOO_EXAMPLE = REPO / "examples" / "train_gloo.py"
P2P_CALLS = frozenset({"c10d::send", "c10d::recv_"})  # their first integer argument after the tensors is the peer
PG_INIT = "## process_group:init ##"


def source_run() -> Path:
    return traces_dir() / "gpu" / "dlrm-8rank"


@dataclass(slots=True)
class SourceRank:
    host: Path
    kineto: dict[str, Any]


def _source_ranks(src: Path) -> list[SourceRank]:
    ranks = sorted((d for d in src.iterdir() if d.is_dir() and d.name.startswith("rank")),
                   key=lambda d: int(d.name[4:]))
    if not ranks:
        raise SystemExit(f"{src}: no rank<N>/ folders")
    return [SourceRank(d / "host.json.gz", load_json(d / "kineto.json.gz")) for d in ranks]


def _group(rank: int, n: int, group_size: int) -> tuple[str, list[int]]:
    lo = rank - rank % group_size
    return str(1 + rank // group_size), list(range(lo, min(lo + group_size, n)))


def _retimer(events: list[dict[str, Any]], rng: random.Random, digits: int | None) -> Callable[[float], float]:
    """This rank's affine map of instants (see the module docstring), rounded to `digits` decimals (None: an int)."""
    t0: float = min(e["ts"] for e in events if _timed(e))
    shift = rng.randint(0, SHIFT_US)
    stretch = 1.0 + rng.uniform(-STRETCH, STRETCH)

    def at(t: float) -> float:
        mapped = t0 + shift + (t - t0) * stretch
        return round(mapped) if digits is None else round(mapped, digits)

    return at


def _retimed(ev: dict[str, Any], at: Callable[[float], float]) -> dict[str, Any]:
    new = dict(ev)
    ts = ev["ts"]
    new["ts"] = at(ts)
    dur = ev.get("dur")
    if isinstance(dur, int | float):
        new["dur"] = at(ts + dur) - new["ts"]  # the mapped end: nested events stay nested
    return new


def _timed(ev: dict[str, Any]) -> bool:
    return isinstance(ev.get("ts"), int | float) and ev.get("ph") != "M"


def _rank_kineto(base: dict[str, Any], rank: int, n: int, group_size: int, rng: random.Random) -> dict[str, Any]:
    events = base["traceEvents"]
    at = _retimer(events, rng, None)
    name, members = _group(rank, n, group_size)
    pg_args = {"Process Group Name": name, "Process Group Ranks": orjson.dumps(members).decode()}
    out: list[dict[str, Any]] = []
    for ev in events:
        if not _timed(ev):
            out.append(ev)
            continue
        new = _retimed(ev, at)
        if ev.get("cat") == "kernel" and ALL_REDUCE_MARK in str(ev.get("name", "")):
            new["args"] = {**(ev.get("args") or {}), **pg_args}
        out.append(new)
    doc = {k: v for k, v in base.items() if k != "traceEvents"}
    doc["distributedInfo"] = {
        **(base.get("distributedInfo") or {}), "rank": rank, "world_size": n,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": n, "ranks": list(range(n))},
                      {"pg_name": name, "pg_desc": "subgroup", "pg_size": len(members), "ranks": members}],
    }
    doc["traceEvents"] = out
    return doc


def _check_n(n: int, group_size: int) -> None:
    if not 1 <= n <= MAX_RANKS:
        raise SystemExit(f"--ranks {n}: must be 1 .. {MAX_RANKS}")
    if group_size < 1:
        raise SystemExit(f"--group-size {group_size}: must be >= 1")


def _write_gz(path: Path, doc: object) -> None:
    path.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1, mtime=0))


def generate(n: int, out: Path, src: Path | None = None, group_size: int = GROUP_SIZE, seed: int = 0,
             source: str = "dlrm") -> Path:
    """An N-rank run folder out/rank<r>/{host,kineto}.json.gz from the real run `src`: gpu/dlrm-8rank for source
    "dlrm" (the default src), a run recorded with etweave.collect for "gloo" (`generate_gloo`)."""
    if source == "gloo":
        if src is None:
            raise SystemExit("--source gloo needs the recorded run (record_gloo)")
        return generate_gloo(n, out, src, seed)
    _check_n(n, group_size)
    sources = _source_ranks(src or source_run())
    rng = random.Random(seed)  # one stream for the whole run: the same N and seed give the same files
    out.mkdir(parents=True, exist_ok=True)
    for r in range(n):
        s = sources[r % len(sources)]
        d = out / f"rank{r}"
        d.mkdir(exist_ok=True)
        shutil.copyfile(s.host, d / "host.json.gz")
        _write_gz(d / "kineto.json.gz", _rank_kineto(s.kineto, r, n, group_size, rng))
    return out


def record_gloo(out: Path, steps: int = 3) -> Path:
    """Record the gloo source: `examples/train_gloo.py` (2 CPU ranks, torch + gloo, etweave.collect) into out."""
    proc = subprocess.run([sys.executable, str(GLOO_EXAMPLE), "--out", str(out), "--steps", str(steps)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"recording the gloo source failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return out


def generate_gloo(n: int, out: Path, src: Path, seed: int = 0) -> Path:
    """An N-rank run from a gloo run recorded with etweave.collect (`record_gloo`), peers rewritten per block of
    the source's S ranks (the module docstring)."""
    hosts = sorted(src.glob("rank*/host.json.gz"), key=lambda p: int(p.parent.name[4:]))
    if not hosts:
        raise SystemExit(f"{src}: no rank<N>/host.json.gz")
    width = len(hosts)
    _check_n(n, 1)
    if n % width:
        raise SystemExit(f"--ranks {n}: must be a multiple of the gloo source's {width} ranks (p2p pairs)")
    sources = [(load_json(h), load_json(h.parent / "kineto.json.gz")) for h in hosts]
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(n):
        host, kineto = sources[r % width]
        base = r - r % width  # the first rank of r's block: a source peer p becomes base + p
        d = out / f"rank{r}"
        d.mkdir(exist_ok=True)
        _write_gz(d / "host.json.gz", _gloo_host(host, n, base))
        _write_gz(d / "kineto.json.gz", _gloo_kineto(kineto, r, n, base, rng))
    return out


def _gloo_host(doc: dict[str, Any], n: int, base: int) -> dict[str, Any]:
    nodes = []
    for node in doc["nodes"]:
        if node["name"] in P2P_CALLS or node["name"] == PG_INIT:
            node = {**node, "inputs": {**node["inputs"], "values": _host_values(node, n, base)}}
        nodes.append(node)
    return {**doc, "nodes": nodes}


def _host_values(node: dict[str, Any], n: int, base: int) -> list[Any]:
    values = list(node["inputs"]["values"])
    if node["name"] == PG_INIT:  # a JSON list of the process groups; "ranks": [] is every rank
        groups = orjson.loads(values[0])
        for g in groups:
            if not g.get("ranks"):
                g["group_size"] = n
        values[0] = orjson.dumps(groups).decode()
        return values
    at = next(i for i, v in enumerate(values) if i > 0 and isinstance(v, int) and not isinstance(v, bool))
    values[at] = base + values[at]
    return values


def _gloo_kineto(base_doc: dict[str, Any], rank: int, n: int, base: int, rng: random.Random) -> dict[str, Any]:
    events = base_doc["traceEvents"]
    at = _retimer(events, rng, 3)  # gloo traces time to the ns
    out: list[dict[str, Any]] = []
    for ev in events:
        new = _retimed(ev, at) if _timed(ev) else ev
        if ev.get("name") in P2P_CALLS and ev.get("cat") == "cpu_op":
            args = dict(ev["args"])
            inputs = list(args["Concrete Inputs"])  # (tensors, group, peer, tag)
            inputs[2] = str(base + int(inputs[2]))
            args["Concrete Inputs"] = inputs
            new = {**new, "args": args}
        out.append(new)
    info = base_doc["distributedInfo"]
    doc = {k: v for k, v in base_doc.items() if k != "traceEvents"}
    doc["distributedInfo"] = {**info, "rank": rank, "world_size": n,
                              "pg_config": [{**g, "pg_size": n, "ranks": list(range(n))} for g in info["pg_config"]]}
    doc["traceEvents"] = out
    return doc


def decode(paths: list[str]) -> int:
    """The floor of `simulate`: decode every .et file with protobuf (read_et), nothing else. Run as its own
    process, so its wall time (interpreter start and imports included) compares like for like."""
    from etweave.chakra.io import read_et

    nodes = 0
    for p in paths:
        _, ns = read_et(Path(p))
        nodes += len(ns)
        del ns  # one file at a time, as simulate's loader frees each protobuf list
    print(orjson.dumps({"nodes": nodes}).decode())
    return 0


@dataclass(slots=True)
class Step:
    name: str
    wall_s: float
    cpu_s: float  # user + sys of the process and the children it waited for (the process pool's workers)
    rss_mb: float
    rc: int
    err: str


def _etweave(*args: str) -> list[str]:
    return [sys.executable, "-m", "etweave", *args]


def _step(name: str, cmd: list[str]) -> Step:
    r = run_proc(cmd, REPO)
    return Step(name, r.wall_s, r.cpu_s, r.rss_kib / 1024, r.rc, r.err.splitlines()[-1] if r.err else "")


class _Cluster:
    """A Dask LocalCluster in a child process (the harness stays small); its address on the child's stdout."""

    SCRIPT = ("import sys\nfrom dask.distributed import LocalCluster\n"
              "c = LocalCluster(n_workers=int(sys.argv[1]), threads_per_worker=1, processes=True,"
              " dashboard_address=None)\nprint(c.scheduler_address, flush=True)\nsys.stdin.read()\nc.close()\n")

    def __init__(self, workers: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, str(workers)], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().decode().strip()
        if not self.address:
            raise RuntimeError("the Dask LocalCluster did not start (pip install 'etweave[cluster]')")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(n: int, work: Path, jobs: int, dask: bool, source: tuple[str, Path | None] = ("dlrm", None)
            ) -> dict[str, Any]:
    run, out = work / f"run{n}", work / f"out{n}"
    kind, src = source
    gen = _step("generate", [sys.executable, "-m", "bench.ranks", "--generate", str(n), "--out", str(run),
                             "--source", kind, *(["--source-run", str(src)] if src is not None else [])])
    if gen.rc != 0:
        return {"n": n, "error": f"generate: {gen.err}"}
    row: dict[str, Any] = {"n": n, "input_mb": sum(f.stat().st_size for f in run.rglob("*.json.gz")) / 1e6}
    steps: list[Step] = []
    convert = _etweave("convert-run", str(run), "-o", str(out), "--quiet", "--jobs", str(jobs))
    cluster = _Cluster(jobs) if dask else None
    try:
        if cluster is not None:
            convert[-2:] = ["--scheduler", cluster.address]
        steps.append(_step("convert-run" + (" (dask)" if dask else ""), convert))
    finally:
        if cluster is not None:
            cluster.close()
    if steps[-1].rc == 0:
        ets = sorted(out.glob("trace.*.et"))
        row["et_mb"] = sum(p.stat().st_size for p in ets) / 1e6
        files = [str(p) for p in ets]
        steps.append(_step("check", _etweave("check", str(out))))
        steps.append(_step("decode", [sys.executable, "-m", "bench.ranks", "--decode", *files]))
        steps.append(_step("simulate", _etweave("simulate", str(out))))
        steps.append(_step("simulate astra", _etweave("simulate", str(out), "--model", "astra-sim")))
        report = orjson.loads((out / "report.json").read_bytes())
        row["nodes"] = sum(r["nodes"] for r in report["ranks"].values())
        row["consistent"] = report["cross_rank"]["consistent"]
    row["steps"] = {s.name: {"wall_s": s.wall_s, "cpu_s": s.cpu_s, "rss_mb": s.rss_mb, "rc": s.rc, "err": s.err}
                    for s in steps}
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return row


def _print_row(row: dict[str, Any]) -> None:
    if "error" in row:
        print(f"{row['n']:>5}  {row['error']}", flush=True)
        return
    print(f"{row['n']:>5} ranks: {row['input_mb']:.1f} MB gz input, {row.get('et_mb', 0):.0f} MB .et, "
          f"{row.get('nodes', 0)} nodes, cross-rank {'consistent' if row.get('consistent') else 'NOT consistent'}")
    for name, s in row["steps"].items():
        failed = f"  FAILED rc {s['rc']}: {s['err']}" if s["rc"] else ""
        print(f"       {name:<20} wall {s['wall_s']:8.2f} s  cpu {s['cpu_s']:8.2f} s  "
              f"cpu/rank {s['cpu_s'] / row['n'] * 1e3:7.1f} ms  peak RSS {s['rss_mb']:7.0f} MB{failed}")
    st = row["steps"]
    if "decode" in st:
        d, dc = st["decode"]["wall_s"], st["decode"]["cpu_s"]
        bound = 2 * row["et_mb"] * 1e6 / 2**20 + 200
        sim, astra = st["simulate"], st["simulate astra"]
        print(f"       simulate / decode, wall (cpu): {sim['wall_s'] / d:.2f} ({sim['cpu_s'] / dc:.2f}) default, "
              f"{astra['wall_s'] / d:.2f} ({astra['cpu_s'] / dc:.2f}) astra-sim [target <= 3]; simulate peak RSS "
              f"{max(sim['rss_mb'], astra['rss_mb']):.0f} MB vs 2 x .et + 200 MB = {bound:.0f} MB", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ranks", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8,64,256", help="comma-separated rank counts (default 8,64,256)")
    p.add_argument("--dask", type=int, metavar="N", help="also convert the N-rank run on a Dask LocalCluster")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="convert-run workers (default: CPUs)")
    p.add_argument("--save", type=Path, metavar="FILE", help="write the rows as JSON")
    p.add_argument("--generate", type=int, metavar="N", help="only write an N-rank run to --out")
    p.add_argument("--out", type=Path, help="with --generate: the run folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--group-size", type=int, default=GROUP_SIZE)
    p.add_argument("--source", choices=SOURCES, default="dlrm",
                   help="dlrm: gpu/dlrm-8rank (default); gloo: a CPU run recorded with etweave.collect, with p2p")
    p.add_argument("--source-run", type=Path, metavar="DIR",
                   help="the source run folder (default: gpu/dlrm-8rank; for gloo, one recorded now)")
    p.add_argument("--decode", nargs="+", metavar="ET", help=argparse.SUPPRESS)  # the floor, as a child
    args = p.parse_args(argv)
    if args.decode:
        return decode(args.decode)
    if args.generate is not None:
        if args.out is None:
            p.error("--generate needs --out")
        with tempfile.TemporaryDirectory(prefix="etweave-gloo-") as tmp:
            src = args.source_run
            if args.source == "gloo" and src is None:
                src = record_gloo(Path(tmp) / "gloo")
            generate(args.generate, args.out, src, group_size=args.group_size, seed=args.seed, source=args.source)
        return 0
    return table(args)


def empty_run(folder: Path) -> list[Path]:
    """Two ranks of one compute node each: what a command costs before any rank's work (its start-up)."""
    from etweave.chakra import et_def_pb2 as pb
    from etweave.chakra.io import write_et

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"trace.{r}.et" for r in range(2)]
    for path in paths:
        node = pb.Node(id=1, name="op", type=pb.COMP_NODE, duration_micros=1)
        node.attr.add(name="num_ops", int64_val=0)
        node.attr.add(name="tensor_size", uint64_val=0)
        node.attr.add(name="is_cpu_op", bool_val=True)
        write_et(path, pb.GlobalMetadata(version="0.0.4"), [node])
    return paths


def startup_cpu(folder: Path, jobs: int) -> dict[str, float]:
    """Per command of the table, the CPU it spends on no work: `check`, `decode` and both `simulate`s of an empty
    run (each imports only its own modules); `convert-run`, whose workers each start an interpreter too, that of
    `python -m etweave --help` (every command's imports) once per process."""
    files = [str(p) for p in empty_run(folder)]
    cpu = {"convert-run": _step("start-up", _etweave("--help")).cpu_s * (1 + jobs),
           "check": _step("start-up", _etweave("check", str(folder))).cpu_s,
           "decode": _step("start-up", [sys.executable, "-m", "bench.ranks", "--decode", *files]).cpu_s,
           "simulate": _step("start-up", _etweave("simulate", str(folder))).cpu_s,
           "simulate astra": _step("start-up", _etweave("simulate", str(folder), "--model", "astra-sim")).cpu_s}
    return cpu


def table(args: argparse.Namespace) -> int:
    """The N-rank table (bench/README.md)."""
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"python {platform.python_version()}; {os.cpu_count()} CPUs; --jobs {args.jobs}; load average "
          f"{os.getloadavg()[0]:.2f} at the start", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="etweave-ranks-") as tmp:
        fixed = startup_cpu(Path(tmp) / "empty", args.jobs)
        print("start-up cpu (an empty run of each command): "
              + ", ".join(f"{name} {cpu:.2f} s" for name, cpu in fixed.items()), flush=True)
        src = args.source_run
        if args.source == "gloo" and src is None:
            src = record_gloo(Path(tmp) / "gloo")
            print(f"recorded the gloo source ({GLOO_EXAMPLE.name})", flush=True)
        source = (args.source, src)
        for n in sizes:
            rows.append(measure(n, Path(tmp), args.jobs, dask=False, source=source))
            _print_row(rows[-1])
        if args.dask:
            rows.append(measure(args.dask, Path(tmp), args.jobs, dask=True, source=source))
            rows[-1]["dask"] = True
            _print_row(rows[-1])
    local = [r for r in rows if "steps" in r and not r.get("dask")]
    for name in ("convert-run", "check", "decode", "simulate", "simulate astra"):
        per = [(r["steps"][name]["cpu_s"] - fixed[name]) / r["n"] for r in local if name in r["steps"]]
        if len(per) >= 2 and min(per) > 0:
            print(f"{name}: cpu per rank net of start-up ({fixed[name]:.2f} s) "
                  f"{', '.join(f'{x * 1e3:.0f}' for x in per)} ms; max/min = {max(per) / min(per):.2f} "
                  "[target <= 1.3]")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.save:
        args.save.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
