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

The table subtracts each command's CPU on a start-up run, the same command on an almost empty run of the same shape
(convert-run: `startup_input`, the smallest run's first ranks cut to the start of each thread, with the same
`--jobs`; the others: `startup_run`, two ranks of its output, one node of every kind), and repeats each command on
each folder until its runs' CPU sums to `--cpu-target`, their mean counting, in interleaved rounds
(`time_interleaved`; bench/README.md says why).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import launch
from bench.run import Proc, run_proc
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
    runs: int = 1  # the runs it is the mean of
    cpu_runs: list[float] = field(default_factory=list)  # each run's CPU, in order


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
        runs = f"  ({s['runs']} runs)" if s.get("runs", 1) > 1 else ""
        print(f"       {name:<20} wall {s['wall_s']:8.2f} s  cpu {s['cpu_s']:8.2f} s  "
              f"cpu/rank {s['cpu_s'] / row['n'] * 1e3:7.1f} ms  peak RSS {s['rss_mb']:7.0f} MB{runs}{failed}")
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
    p.add_argument("--cpu-target", type=float, default=CPU_TARGET_S, metavar="S",
                   help=f"run each command on each folder until its runs' CPU sums to S seconds (default "
                        f"{CPU_TARGET_S:g}); their mean counts")
    p.add_argument("--most-runs", type=int, default=MOST_RUNS, metavar="K",
                   help=f"at most K runs of a command on a folder (default {MOST_RUNS})")
    p.add_argument("--fewest-runs", type=int, default=FEWEST_RUNS, metavar="K",
                   help=f"at least K runs of a command on a folder (default {FEWEST_RUNS})")
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
    launch.start()  # while this process is small (`bench.launch`)
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


# ---- the start-up run: what each command costs before any rank's work

StartupKey = tuple[int, str, str, str, bool]  # node type, `kind` attr, comm_type, pg_name, a process-group init


def _startup_key(node: Any) -> StartupKey:
    from etweave.chakra.io import node_attrs

    attrs = node_attrs(node)
    return (node.type, str(attrs.get("kind", "")), str(attrs.get("comm_type", "")), str(attrs.get("pg_name", "")),
            node.name == PG_INIT)


def _p2p_channel(node: Any) -> tuple[int, int, int]:
    from etweave.chakra.io import node_attrs

    attrs = node_attrs(node)
    return int(str(attrs["comm_src"])), int(str(attrs["comm_dst"])), int(str(attrs["comm_tag"]))


def startup_run(real: Path, folder: Path) -> list[Path]:
    """The start-up run of the real output folder `real`: its first two ranks, each cut to the first node of every
    kind it has (node type, `kind` attr, collective type, process group, the process-group init node), so a
    command meets every message, attr and node kind, the comm-group map, report.json and the collective and
    send/recv bookkeeping a real run makes it meet, with next to no work. Collectives are kept where both ranks
    have that kind, a send only with the other rank's recv of its channel (and the reverse), so the cut checks
    clean and replays with no stuck node; each rank's kept nodes are chained in one order (the same on both
    ranks: kinds sorted) by data_deps, in place of the deps to nodes cut away. The comm-group map and
    report.json are the real ones cut to the two ranks."""
    from etweave.chakra import et_def_pb2 as pb
    from etweave.chakra.io import read_et, write_et
    from etweave.runfolder import COMM_GROUP_FILE, REPORT_FILE, split_rank_name

    files = sorted(real.glob("*.et"), key=lambda p: (split_rank_name(p) or ("", 0))[1])[:2]
    ranks = [(split_rank_name(p) or ("", 0))[1] for p in files]
    metas, kept = [], []
    for path in files:
        metadata, nodes = read_et(path)
        first: dict[StartupKey, pb.Node] = {}
        for node in nodes:
            first.setdefault(_startup_key(node), node)
        metas.append(metadata)
        kept.append(first)
    _pair_comm(kept, ranks)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for path, metadata, first in zip(files, metas, kept, strict=True):
        chain = [first[k] for k in sorted(first)]
        for prev, node in zip([None, *chain], chain, strict=False):
            del node.data_deps[:], node.ctrl_deps[:]
            if prev is not None:
                node.data_deps.append(prev.id)
        write_et(folder / path.name, metadata, chain)
        out.append(folder / path.name)
    groups = orjson.loads((real / COMM_GROUP_FILE).read_bytes()) if (real / COMM_GROUP_FILE).is_file() else {}
    cut = {g: [r for r in members if r in ranks] for g, members in groups.items()}
    (folder / COMM_GROUP_FILE).write_bytes(orjson.dumps({g: m for g, m in cut.items() if m}))
    if (real / REPORT_FILE).is_file():
        report = orjson.loads((real / REPORT_FILE).read_bytes())
        report["ranks"] = {str(r): report["ranks"][str(r)] for r in ranks if str(r) in report.get("ranks", {})}
        (folder / REPORT_FILE).write_bytes(orjson.dumps(report))
    return out


def _pair_comm(kept: list[dict[StartupKey, Any]], ranks: list[int]) -> None:
    """Keep a collective kind only where every rank of the cut has it, a send only beside the other rank's first
    recv of the same channel (and the reverse): what matches across ranks in the real run matches in the cut."""
    from etweave.chakra import et_def_pb2 as pb

    coll = [{k for k, n in first.items() if n.type == pb.COMM_COLL_NODE} for first in kept]
    both = set.intersection(*coll) if coll else set()
    for first in kept:
        for key in [k for k, n in first.items() if n.type == pb.COMM_COLL_NODE and k not in both]:
            del first[key]
    p2p = [{_p2p_channel(n): k for k, n in first.items() if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)}
           for first in kept]
    for first, channels in zip(kept, p2p, strict=True):
        for channel, key in channels.items():
            if sum(channel in other for other in p2p) < 2 or not set(channel[:2]) <= set(ranks):
                del first[key]

# ---- the start-up input of convert-run: the real input's first ranks, each cut to the start of its threads

STARTUP_SHARE = 0.03  # of each CPU thread's ops kept in convert-run's start-up input (dlrm: ~120 of 4241 nodes)
HOST_ROOT_MARK = "[pytorch|profiler|execution_"  # the host ET's process and thread roots (kept whole)
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def startup_input(run: Path, folder: Path, ranks: int = 2, share: float = STARTUP_SHARE) -> Path:
    """Convert-run's start-up input, from the real run folder `run`: its first `ranks` ranks (as many as the
    workers the real run starts), each with the same files, cut to the first `share` of each CPU thread's ops,
    and never past the thread's first communication op, so the ranks' collective and send/recv sequences are
    empty alike and the cut converts clean with the same command line. Kineto: the cpu ops, annotations and
    runtime calls that start before the cut, the GPU ops and flows of the launches kept, every other event
    (metadata, `distributedInfo`) as it is; host ET: its roots and the first ops of each thread, as many as the
    Kineto thread of the same rank in start order keeps and none past the thread's first communication op. So
    `convert-run` meets everything a rank makes it meet (both readers, the linker, the pool and its workers'
    imports, the cross-rank work, the report), with next to no work per rank."""
    dirs = sorted((d for d in run.iterdir() if d.is_dir() and d.name.startswith("rank")), key=lambda d: int(d.name[4:]))
    for d in dirs[:ranks]:
        kineto = load_json(d / "kineto.json.gz")
        kept = _cut_kineto(kineto, share)
        (folder / d.name).mkdir(parents=True, exist_ok=True)
        _write_gz(folder / d.name / "kineto.json.gz", kineto)
        if (d / "host.json.gz").is_file():
            _write_gz(folder / d.name / "host.json.gz", _cut_host(load_json(d / "host.json.gz"), kept))
    return folder


def _is_comm(name: object) -> bool:
    from etweave.collectives import classify

    return isinstance(name, str) and (name == "record_param_comms" or classify(name) is not None)


_Thread = tuple[Any, Any]  # (pid, tid)


def _thread_marks(events: list[dict[str, Any]]) -> tuple[dict[_Thread, list[tuple[float, bool]]], set[_Thread]]:
    """Per CPU thread, the start of each of its ops and whether it is a communication op (`_cut_kineto`), and the
    threads with cpu ops or runtime calls (those the host ET's cut is matched to)."""
    comm_launch = {(e.get("args") or {}).get("correlation") for e in events
                   if e.get("cat") in GPU_CATS and _is_comm(e.get("name"))}
    starts: dict[_Thread, list[tuple[float, bool]]] = {}
    op_threads: set[_Thread] = set()
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X":
            continue
        if cat in ("cpu_op", "cuda_runtime"):
            thread = (e["pid"], e["tid"])
            op_threads.add(thread)
            comm = _is_comm(e["name"]) or (cat == "cuda_runtime" and e["args"].get("correlation") in comm_launch)
            starts.setdefault(thread, []).append((e["ts"], comm and cat == "cpu_op"))
            if comm and cat == "cuda_runtime":  # the launch of a collective kernel: cut before it
                starts[thread].append((e["ts"], True))
        elif cat == "user_annotation" and _is_comm(e.get("name")):
            # gloo's collectives are annotations ("gloo:all_reduce"), some on threads with no cpu op at all
            starts.setdefault((e["pid"], e["tid"]), []).append((e["ts"], True))
    return starts, op_threads


def _cut_kineto(doc: dict[str, Any], share: float) -> list[int]:
    """Cut `doc`'s events in place (`startup_input`); the ops kept per CPU thread, the threads in start order."""
    events = doc["traceEvents"]
    starts, op_threads = _thread_marks(events)
    cut: dict[tuple[Any, Any], float] = {}
    for thread, marks in starts.items():
        marks.sort()
        ops = sum(1 for _, comm in marks if not comm)  # (runtime calls count as ops here: a share of the thread)
        first_comm = next((ts for ts, comm in marks if comm), math.inf)
        at = math.ceil(share * ops)
        cut[thread] = min(first_comm, marks[at][0] if at < len(marks) else math.inf)
    kept, launched = [], set()
    counts: dict[tuple[Any, Any], int] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime"):
            thread = (e["pid"], e["tid"])
            if e["ts"] >= cut.get(thread, math.inf):
                continue
            if e["cat"] == "cuda_runtime":
                launched.add(e["args"].get("correlation"))
            elif not str(e.get("name", "")).startswith("ProfilerStep#"):  # the step has no host node
                counts[thread] = counts.get(thread, 0) + 1
        kept.append(e)
    doc["traceEvents"] = [
        e for e in kept
        if not (e.get("cat") in GPU_CATS and (e.get("args") or {}).get("correlation") not in launched)
        and not (e.get("cat") == "ac2g" and e.get("id") not in launched)]
    first_ts = {t: min(ts for ts, _ in marks) for t, marks in starts.items() if t in op_threads}
    return [counts.get(t, 0) for t in sorted(first_ts, key=first_ts.__getitem__)]


def _cut_host(doc: dict[str, Any], kept: list[int]) -> dict[str, Any]:
    """The host ET's roots and, per thread (threads in first-op order), as many first ops as `kept` says, never
    past the thread's first communication op (a host thread need not be the Kineto thread of the same place in
    start order: a cut by count alone kept a different number of collectives on each rank of a gloo run)."""
    ops: dict[int, list[dict[str, Any]]] = {}
    roots = []
    for node in doc["nodes"]:
        if str(node["name"]).startswith(HOST_ROOT_MARK):
            roots.append(node)
        else:
            ops.setdefault(_host_tid(node), []).append(node)
    nodes = list(roots)
    threads = sorted(ops.values(), key=lambda nodes: min(n["id"] for n in nodes))
    for i, thread in enumerate(threads):
        ordered = sorted(thread, key=lambda n: n["id"])
        first_comm = next((at for at, n in enumerate(ordered) if _is_comm(n["name"])), len(ordered))
        nodes += ordered[:min(first_comm, kept[i] if i < len(kept) else 0)]
    return {**doc, "nodes": sorted(nodes, key=lambda n: n["id"])}


def _host_tid(node: dict[str, Any]) -> Any:
    """A host ET node's thread: a field of its own (schema 1.0.1), else in its attrs (1.0.3 and later)."""
    if "tid" in node:
        return node["tid"]
    return next((a.get("value") for a in node.get("attrs", ()) if a.get("name") == "tid"), None)

# ---- the N-rank table: every size prepared first, then each command timed on every size, interleaved

COMMANDS = ("convert-run", "check", "decode", "simulate", "simulate astra")
CPU_TARGET_S = 20.0  # each (command, size) is run until its runs' CPU sums to this (the start-up run too) ...
MOST_RUNS = 25  # ... or this many runs ...
FEWEST_RUNS = 1  # ... and at least this many


@dataclass(frozen=True, slots=True)
class Repeats:
    """How often each command runs on each folder (`runs_needed`)."""

    target_s: float = CPU_TARGET_S
    most: int = MOST_RUNS
    fewest: int = FEWEST_RUNS


def runs_needed(first_cpu_s: float, repeats: Repeats = Repeats()) -> int:
    """How many runs a command gets on one folder, from its first run's CPU: enough that their CPU sums to
    `repeats.target_s` (so every size is measured over a similar amount of CPU, as one long run of the largest
    is), at least `repeats.fewest` (a second run of the largest sizes halves the weight of one slow stretch of
    the host's time on their mean) and at most `repeats.most`."""
    if first_cpu_s <= 0:
        return repeats.most
    return max(repeats.fewest, min(repeats.most, math.ceil(repeats.target_s / first_cpu_s)))


@dataclass(slots=True)
class Runs:
    """The runs of one command on one folder."""

    name: str
    procs: list[Proc] = field(default_factory=list)
    wanted: int = 1

    def add(self, proc: Proc, repeats: Repeats) -> None:
        self.procs.append(proc)
        if len(self.procs) == 1:
            self.wanted = runs_needed(proc.cpu_s, repeats) if proc.rc == 0 else 1

    def step(self, scale: float = 1.0) -> Step:
        """The runs' mean CPU and wall (their CPU over the same amount of CPU as one long run: it counts the host's
        slow stretches as a long run does, where a median or the best run would leave them out of the short runs
        only; bench/README.md) and the largest peak RSS; CPU times `scale`."""
        cpu = statistics.mean(p.cpu_s for p in self.procs) * scale
        failed = next((p for p in self.procs if p.rc), None)
        return Step(self.name, statistics.mean(p.wall_s for p in self.procs), cpu,
                    max(p.rss_kib for p in self.procs) / 1024, failed.rc if failed else 0,
                    failed.err.splitlines()[-1] if failed and failed.err else "", len(self.procs),
                    [p.cpu_s * scale for p in self.procs])


@dataclass(slots=True)
class Prepared:
    """One size, generated and converted (its first convert-run timed), kept until every command has run on it."""

    n: int
    run: Path
    out: Path
    row: dict[str, Any]
    runs: dict[str, Runs] = field(default_factory=dict)


def prepare(n: int, work: Path, jobs: int, source: tuple[str, Path | None], repeats: Repeats
            ) -> Prepared:
    run, out = work / f"run{n}", work / f"out{n}"
    kind, src = source
    gen = _step("generate", [sys.executable, "-m", "bench.ranks", "--generate", str(n), "--out", str(run),
                             "--source", kind, *(["--source-run", str(src)] if src is not None else [])])
    prep = Prepared(n, run, out, {"n": n})
    if gen.rc != 0:
        prep.row["error"] = f"generate: {gen.err}"
        return prep
    prep.row["input_mb"] = sum(f.stat().st_size for f in run.rglob("*.json.gz")) / 1e6
    convert = Runs("convert-run")
    convert.add(run_proc(_etweave("convert-run", str(run), "-o", str(out), "--quiet", "--jobs", str(jobs)), REPO),
                repeats)
    prep.runs["convert-run"] = convert
    if convert.procs[0].rc == 0:
        prep.row["et_mb"] = sum(p.stat().st_size for p in out.glob("trace.*.et")) / 1e6
        report = orjson.loads((out / "report.json").read_bytes())
        prep.row["nodes"] = sum(r["nodes"] for r in report["ranks"].values())
        prep.row["consistent"] = report["cross_rank"]["consistent"]
    return prep


def _command(name: str, out: Path, run: Path, scratch: Path, jobs: int) -> list[str]:
    """The command line of `name` on output folder `out` (convert-run: of run folder `run`, into `scratch`)."""
    if name == "convert-run":
        shutil.rmtree(scratch, ignore_errors=True)
        return _etweave("convert-run", str(run), "-o", str(scratch), "--quiet", "--jobs", str(jobs))
    if name == "decode":
        return [sys.executable, "-m", "bench.ranks", "--decode", *(str(p) for p in sorted(out.glob("*.et")))]
    if name == "check":
        return _etweave("check", str(out))
    return _etweave("simulate", str(out), *(["--model", "astra-sim"] if name == "simulate astra" else []))


def time_interleaved(sizes: list[Prepared], startup: tuple[Path, Path], work: Path, jobs: int, repeats: Repeats
                     ) -> dict[str, Runs]:
    """Every command on the start-up run (`startup`: its output folder, for convert-run its input) and on every
    size, in rounds (round k runs each (command, folder) that wants a k-th run), so the repeats of the small
    sizes spread over the same stretch of the host's time as the large ones; the runs of the start-up run are
    returned, each size's go into its `runs`."""
    start = {name: Runs(name) for name in COMMANDS}
    ok = [p for p in sizes if "et_mb" in p.row]
    cells: list[tuple[Runs, Path, Path]] = [(start[name], *startup) for name in COMMANDS]
    cells += [(p.runs.setdefault(name, Runs(name)), p.out, p.run) for p in ok for name in COMMANDS]
    scratch = work / "convert-again"
    while todo := [c for c in cells if not c[0].procs or len(c[0].procs) < c[0].wanted]:
        for runs, out, run in todo:
            runs.add(run_proc(_command(runs.name, out, run, scratch, jobs), REPO), repeats)
    shutil.rmtree(scratch, ignore_errors=True)
    return start


def table(args: argparse.Namespace) -> int:
    """The N-rank table (bench/README.md)."""
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"python {platform.python_version()}; {os.cpu_count()} CPUs; --jobs {args.jobs}; load average "
          f"{os.getloadavg()[0]:.2f} at the start; mean CPU of runs summing to >= {args.cpu_target:g} s "
          f"(at least {args.fewest_runs}, at most {args.most_runs}) per command and folder", flush=True)
    repeats = Repeats(args.cpu_target, args.most_runs, args.fewest_runs)
    rows = []
    with tempfile.TemporaryDirectory(prefix="etweave-ranks-") as tmp:
        work = Path(tmp)
        src = args.source_run
        if args.source == "gloo" and src is None:
            src = record_gloo(work / "gloo")
            print(f"recorded the gloo source ({GLOO_EXAMPLE.name})", flush=True)
        source = (args.source, src)
        prepared = []
        for n in sizes:
            prepared.append(prepare(n, work, args.jobs, source, repeats))
            print(f"{n:>5} ranks generated and converted", flush=True)
        ok = [p for p in prepared if "et_mb" in p.row]
        if ok:
            startup_run(ok[0].out, work / "startup" / "out")
            # as many ranks as the workers the real runs start (the pool starts no more workers than ranks)
            startup_input(ok[0].run, work / "startup" / "run", max(2, min(args.jobs, ok[0].n)))
            start = time_interleaved(prepared, (work / "startup" / "out", work / "startup" / "run"), work,
                                     args.jobs, repeats)
            fixed = {name: r.step() for name, r in start.items()}
            print(f"start-up: the start-up run of {ok[0].n} ranks (startup_input, startup_run), mean CPU: "
                  + ", ".join(
                f"{name} {s.cpu_s:.2f} s ({s.runs} runs{', FAILED rc ' + str(s.rc) if s.rc else ''})"
                for name, s in fixed.items()), flush=True)
        for p in prepared:
            p.row["steps"] = {name: _as_json(r.step()) for name, r in p.runs.items()}
            rows.append(p.row)
            _print_row(p.row)
            shutil.rmtree(p.run, ignore_errors=True)
            shutil.rmtree(p.out, ignore_errors=True)
        if args.dask:
            rows.append(measure(args.dask, work, args.jobs, dask=True, source=source))
            rows[-1]["dask"] = True
            _print_row(rows[-1])
    if ok:
        _print_flatness([r for r in rows if "steps" in r and not r.get("dask")], fixed)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.save:  # the start-up runs last, as a row of their own (`startup`: the size they were cut from)
        startup = [{"startup": ok[0].n, "steps": {name: _as_json(s) for name, s in fixed.items()}}] if ok else []
        args.save.write_bytes(orjson.dumps([*rows, *startup], option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def _as_json(s: Step) -> dict[str, Any]:
    return {"wall_s": s.wall_s, "cpu_s": s.cpu_s, "rss_mb": s.rss_mb, "rc": s.rc, "err": s.err, "runs": s.runs,
            "cpu_runs": s.cpu_runs}


def _print_flatness(local: list[dict[str, Any]], fixed: dict[str, Step]) -> None:
    for name in COMMANDS:
        per = [(r["steps"][name]["cpu_s"] - fixed[name].cpu_s) / r["n"] for r in local if name in r["steps"]]
        if len(per) >= 2 and min(per) > 0:
            print(f"{name}: cpu per rank net of start-up ({fixed[name].cpu_s:.2f} s) "
                  f"{', '.join(f'{x * 1e3:.0f}' for x in per)} ms; max/min = {max(per) / min(per):.2f} "
                  "[target <= 1.3]")
        marginal = _marginal(local, name)
        if len(marginal) >= 2 and min(cost for _, _, cost in marginal) > 0:
            costs = [cost for _, _, cost in marginal]
            print(f"{name}: marginal cpu per rank " + ", ".join(f"{a}->{b} {cost * 1e3:.0f}" for a, b, cost in marginal)
                  + f" ms; max/min = {max(costs) / min(costs):.2f}")


def _marginal(local: list[dict[str, Any]], name: str) -> list[tuple[int, int, float]]:
    """(n, next n, CPU per added rank) between consecutive sizes: every cost that does not grow with the ranks
    cancels, whatever the start-up run leaves out (a diagnostic beside the table's measure, which divides by n)."""
    sized = sorted((r["n"], r["steps"][name]["cpu_s"]) for r in local if name in r["steps"])
    return [(a, b, (tb - ta) / (b - a)) for (a, ta), (b, tb) in itertools.pairwise(sized) if b > a]


if __name__ == "__main__":
    sys.exit(main())
