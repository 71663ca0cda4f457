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

Per rank, `convert_rank` (a top-level function returning plain data, so a process pool and a Dask cluster give
byte-identical results) runs the single-rank pipeline. Then, on all ranks together:
  - process groups: the host ET `## process_group:init ##`, Kineto `distributedInfo.pg_config` and the
    `Process Group Name`/`Process Group Ranks` event args of every rank give one map trace name -> global ranks;
    the world group is "", every other group gets one decimal id (its trace name when that is decimal), written
    to `comm_group.json`, and every comm node's `pg_name` is rewritten to it, so one group has one id on every
    rank.
  - collective sequences: in each group, every member rank must issue the same collectives in the same order
    (ascending node id, the order the simulator matches them in): same kind (from `collective_name`), same
    `comm_seq` where both have one, and same size for the kinds that need equal sizes (all_reduce, reduce,
    all_gather, reduce_scatter, broadcast, barrier; all_to_all sizes legitimately differ). Members of a group
    that are not in the run (world size from Kineto `distributedInfo`) are reported as absent; the present
    ones are checked.
  - durations: a collective's measured duration includes waiting for the slowest peer. For every matched
    collective (before any divergence), each member's `duration_micros` becomes its end minus the latest start
    among the members, clamped to >= 0 (>= 1 when measured > 0) and never above its old value, and is also
    written to attr `transfer_duration_micros`; `measured_duration_micros` keeps the measured one.
  - `check_nodes` per rank and `check_run` across ranks on the final nodes.
Outputs are written only when all of that passed (a divergence passes only with `allow_mismatch`), each file
atomically; a failed run writes nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from google.protobuf.internal.decoder import _DecodeVarint32  # type: ignore[attr-defined]

from etweave import __version__
from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import attr_value, write_et
from etweave.check import Violation, check_nodes, check_run, comm_type_name
from etweave.collectives import classify
from etweave.convert import no_gc, process_groups, run_pipeline, write_json
from etweave.errors import BadInput, CheckFailed
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto

HOST, KINETO = "host", "kineto"
COMM_GROUP_FILE, REPORT_FILE = "comm_group.json", "report.json"
_PEEK = 4096
_RANK_DIR = re.compile(r"^rank[_-]?(\d+)$", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_RANK_SUFFIX = re.compile(r"_(\d+)\.json(?:\.gz)?$", re.IGNORECASE)
_KINETO_MARK = re.compile(rb'"(?:traceEvents|schemaVersion|deviceProperties|distributedInfo)"\s*:')
_HOST_MARK = re.compile(rb'"(?:schema|nodes)"\s*:')
# Kinds whose members must all pass the same byte count (all_to_all(v), gather and scatter legitimately differ).
_EQUAL_SIZE = frozenset({pb.ALL_REDUCE, pb.REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.REDUCE_SCATTER_BLOCK,
                         pb.BROADCAST, pb.BARRIER})
# Cross-rank violations that --allow-mismatch turns into report entries instead of a failure.
_MISMATCH_RULES = frozenset({"coll-mismatch", "p2p-match"})
_SHOWN = 10


# ---------------------------------------------------------------------------------------------- discovery


@dataclass(slots=True)
class RankFiles:
    rank: int | None  # None: a one-rank folder whose rank the Kineto trace tells
    host: Path | None = None
    kineto: Path | None = None


@dataclass(slots=True)
class Discovery:
    ranks: list[RankFiles]
    ignored: list[str] = field(default_factory=list)  # readable JSON files that are no trace


def sniff(path: Path) -> str | None:
    """HOST, KINETO, or None for readable JSON that is neither; BadInput when the file is empty or corrupt."""
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc
    head = raw
    if raw[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=31).decompress(raw, _PEEK)
        except zlib.error as exc:
            raise BadInput(path, f"corrupt gzip data: {exc}") from exc
    head = head[:_PEEK]
    if not head.strip():
        raise BadInput(path, "empty (or truncated before its first bytes): cannot tell which trace it is")
    if _KINETO_MARK.search(head) or head.lstrip()[:1] == b"[":
        return KINETO
    if _HOST_MARK.search(head):
        return HOST
    return None


def _is_json(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and (name.endswith(".json") or name.endswith(".json.gz"))


def _rank_in_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name) or _RANK_SUFFIX.search(name)
    return int(m.group(1)) if m else None


def discover(run_dir: Path) -> Discovery:
    """The ranks of a run folder and their trace files (rules in the module docstring)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(run_dir, "not a folder")
    found: dict[int, RankFiles] = {}
    ignored: list[str] = []

    def add(rank: int, path: Path) -> None:
        kind = sniff(path)
        if kind is None:
            ignored.append(str(path))
            return
        rf = found.setdefault(rank, RankFiles(rank))
        other = getattr(rf, kind)
        if other is not None:
            what = "host execution traces" if kind == HOST else "Kineto traces"
            raise BadInput(run_dir, f"rank {rank} has two {what}: {other} and {path}")
        setattr(rf, kind, path)

    entries = sorted(run_dir.iterdir())
    for entry in entries:
        m = _RANK_DIR.match(entry.name)
        if entry.is_dir() and m:
            for path in sorted(entry.iterdir()):
                if _is_json(path):
                    add(int(m.group(1)), path)
    unranked: list[Path] = []
    for entry in entries:
        if not _is_json(entry):
            continue
        rank = _rank_in_name(entry.name)
        if rank is None:
            unranked.append(entry)
        else:
            add(rank, entry)
    if not found:
        single = RankFiles(None)
        for path in unranked:
            kind = sniff(path)
            if kind is None:
                ignored.append(str(path))
            elif getattr(single, kind) is not None:
                raise BadInput(run_dir, f"no rank folders (rank<N>/) or files with a rank in their name, and "
                                        f"more than one {kind} trace ({getattr(single, kind).name}, {path.name}): "
                                        "cannot tell which belong together")
            else:
                setattr(single, kind, path)
        if single.host is None and single.kineto is None:
            raise BadInput(run_dir, "no ranks found: expected rank<N>/ folders with host and/or Kineto traces, or "
                                    "files named like *rank<N>*.json[.gz] or *_<N>.json[.gz]")
        return Discovery([single], ignored)
    ignored.extend(str(p) for p in unranked)
    return Discovery([found[r] for r in sorted(found)], ignored)


# ---------------------------------------------------------------------------------------------- one rank


def convert_rank(rank: int | None, host: str | None, kineto: str | None) -> dict[str, Any]:
    """See _convert_rank; the collector is off while it runs (see etweave.convert.no_gc)."""
    with no_gc():
        return _convert_rank(rank, host, kineto)


def _convert_rank(rank: int | None, host: str | None, kineto: str | None) -> dict[str, Any]:
    """Convert one rank; plain, picklable data back (the same whether run here, in a pool or on Dask).

    Returns {"rank", "et" (the .et stream bytes), "report", "local_groups" (trace pg name -> the id the
    converter wrote), "groups" (pg descriptions), "world_size", "trace_rank"}, or {"rank", "error": {"where",
    "problem"}} on bad input (BadInput does not survive pickling: its constructor takes two arguments).
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
        for ev in kineto_trace.events:
            args = ev.args
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
        result = run_pipeline(host_trace, kineto_trace, rank)
    except BadInput as exc:
        return {"rank": rank, "error": {"where": exc.where, "problem": exc.problem}}
    out_rank = next(int(a.int64_val) for a in result.metadata.attr if a.name == "rank")
    return {"rank": out_rank, "et": serialize(result.metadata, result.nodes), "report": result.report,
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


def serialize(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> bytes:
    """The .et stream as `write_et` writes it (length-prefixed, deterministic serialization)."""
    from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

    parts: list[bytes] = []
    for msg in (metadata, *nodes):
        data = msg.SerializeToString(deterministic=True)
        parts.append(_VarintBytes(len(data)))
        parts.append(data)
    return b"".join(parts)


def parse(data: bytes) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """Inverse of `serialize` (the bytes come from our own worker, so they are well formed)."""
    pos, end = 0, len(data)
    metadata = pb.GlobalMetadata()
    nodes: list[pb.Node] = []
    first = True
    while pos < end:
        size, pos = _DecodeVarint32(data, pos)
        chunk = data[pos:pos + size]
        pos += size
        if first:
            metadata.ParseFromString(chunk)
            first = False
        else:
            node = pb.Node()
            node.ParseFromString(chunk)
            nodes.append(node)
    return metadata, nodes


# ---------------------------------------------------------------------------------------------- executing


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def convert_ranks(ranks: Sequence[RankFiles], jobs: int | None = None, scheduler: str | None = None,
                  progress: bool = False) -> list[dict[str, Any]]:
    """Run `convert_rank` for every rank: in this process (jobs 1), a process pool, or on a Dask cluster.
    Raises BadInput for the first rank (in rank order) whose input is bad."""
    tasks = [(rf.rank, str(rf.host) if rf.host else None, str(rf.kineto) if rf.kineto else None) for rf in ranks]
    bar = _progress(len(tasks), progress)
    try:
        if scheduler is not None:
            outputs = _on_dask(tasks, scheduler, bar.update)
        else:
            workers = min(jobs or default_jobs(), len(tasks))
            outputs = _local(tasks, workers, bar.update)
    finally:
        bar.close()
    failed = [o for o in outputs if "error" in o]
    if failed:
        err = failed[0]["error"]
        raise BadInput(err["where"], err["problem"])
    return outputs


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="rank", desc="converting", file=sys.stderr, leave=False)


def _local(tasks: list[tuple[int | None, str | None, str | None]], workers: int,
           done: Callable[[int], Any]) -> list[dict[str, Any]]:
    if workers <= 1:
        outputs = []
        for task in tasks:
            outputs.append(convert_rank(*task))
            done(1)
            if "error" in outputs[-1]:
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
            if future.exception() is not None or "error" in future.result():
                for f in futures:  # the run has failed: do not start the ranks still queued
                    f.cancel()
                break
        failed = [f for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            raise failed[0].exception()  # type: ignore[misc]  # an etweave bug, or input it cannot convert yet
        return [f.result() for f in futures if f.done() and not f.cancelled()]


def _on_dask(tasks: list[tuple[int | None, str | None, str | None]], address: str,
             done: Callable[[int], Any]) -> list[dict[str, Any]]:
    try:
        from dask.distributed import Client, as_completed
    except ImportError as exc:
        raise BadInput("--scheduler", "needs dask[distributed]: pip install 'etweave[cluster]'") from exc
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise BadInput(address, f"cannot connect to the Dask scheduler: {exc}") from exc
    with client:
        # Workers read the trace files by path: they must see RUN_DIR at the same path (a shared file system).
        futures = [client.submit(convert_rank, *task, pure=False) for task in tasks]
        for _ in as_completed(futures):
            done(1)
        return list(client.gather(futures))


# ---------------------------------------------------------------------------------------------- the run


@dataclass(slots=True)
class CollSig:
    """What one rank has at one position of a group's collective sequence."""

    node: int
    name: str
    kind: int
    size: int
    seq: int | None
    start: int
    end: int  # start + measured (inclusive) duration

    def describe(self, with_seq: bool = True) -> str:
        seq = f" seq {self.seq}" if with_seq and self.seq is not None else ""
        return f"{self.name} ({comm_type_name(self.kind)}) {self.size} B{seq}, node {self.node}"


@dataclass(slots=True)
class RunResult:
    ranks: dict[int, tuple[pb.GlobalMetadata, list[pb.Node]]]
    comm_group: dict[str, list[int]]
    report: dict[str, Any]
    consistent: bool
    messages: list[str]  # divergences and failing checks, one line each (what the CLI prints on failure)


def _range_text(ranks: Iterable[int]) -> str:
    """0-2,4,6-7."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def _group_label(gid: str) -> str:
    return "the world group" if gid == "" else f"group {gid}"


def build_comm_group(outputs: Sequence[dict[str, Any]], world: int | None
                     ) -> tuple[dict[str, list[int]], dict[str, str], list[str]]:
    """(comm_group map id -> ranks, trace pg name -> id ("" = world), notes) from every rank's descriptions."""
    notes: list[str] = []
    ranks_of: dict[str, list[int]] = {}
    for out in outputs:
        for grp in out["groups"]:
            ranks = grp["ranks"]
            if ranks is None:
                continue
            known = ranks_of.setdefault(grp["name"], ranks)
            # [] means all ranks: it agrees with an explicit list of the world, so only two lists can conflict
            if known != ranks and ranks and known:
                notes.append(f"process group {grp['name']!r}: rank {out['rank']} ({grp['source']}) lists ranks "
                             f"{_range_text(ranks)}, another source {_range_text(known)}; kept the first")
    ids: dict[str, str] = {}
    subgroups: list[tuple[list[int], str]] = []
    for name, ranks in ranks_of.items():
        if ranks == [] or (world is not None and ranks == list(range(world))):
            ids[name] = ""
        else:
            subgroups.append((ranks, name))
    taken: set[str] = set()
    # Decimal trace names keep their number; the others get the next free ids in a rank-list order that is the
    # same on every run, so an id never depends on which rank was read first.
    for _ranks, name in sorted(subgroups):
        if name.isdecimal() and name not in taken:
            ids[name] = name
            taken.add(name)
    next_id = 0
    for _ranks, name in sorted(subgroups):
        if name in ids:
            continue
        while str(next_id) in taken:
            next_id += 1
        ids[name] = str(next_id)
        taken.add(str(next_id))
    comm_group = {ids[name]: ranks for ranks, name in subgroups}
    return dict(sorted(comm_group.items(), key=lambda kv: int(kv[0]))), ids, notes


def _attr(node: pb.Node, name: str) -> pb.AttributeProto | None:
    for a in node.attr:
        if a.name == name:
            return a
    return None


def _int_attr(node: pb.Node, name: str) -> int | None:
    a = _attr(node, name)
    if a is None:
        return None
    value = attr_value(a)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _signature(node: pb.Node) -> CollSig:
    name_attr = _attr(node, "collective_name")
    name = str(attr_value(name_attr)) if name_attr is not None else ""
    comm_type = _int_attr(node, "comm_type") or 0
    kind = classify(name) if name else None
    measured = _int_attr(node, "measured_duration_micros")
    start = node.start_time_micros
    return CollSig(node=node.id, name=name or comm_type_name(comm_type),
                   kind=kind if isinstance(kind, int) else comm_type, size=_int_attr(node, "comm_size") or 0,
                   seq=_int_attr(node, "comm_seq"), start=start,
                   end=start + (measured if measured is not None else node.duration_micros))


def _key(sig: CollSig | None, with_seq: bool) -> tuple[Any, ...] | None:
    if sig is None:
        return None
    return (sig.kind, sig.seq if with_seq else None, sig.size if sig.kind in _EQUAL_SIZE else None)


def check_sequences(seqs: dict[int, list[CollSig]]) -> tuple[list[dict[str, Any]], int]:
    """First divergence per member rank from the majority sequence, and the length of the prefix on which all
    members agree (the collectives that match across ranks)."""
    members = sorted(seqs)
    longest = max((len(s) for s in seqs.values()), default=0)
    diverged: dict[int, dict[str, Any]] = {}
    matched = longest
    for i in range(longest):
        at = {r: seqs[r][i] if i < len(seqs[r]) else None for r in members}
        with_seq = all(s is not None and s.seq is not None for s in at.values())
        keys = {r: _key(s, with_seq) for r, s in at.items()}
        counts = Counter(keys[r] for r in members)  # insertion in rank order: a tie goes to the lowest rank
        majority = counts.most_common(1)[0][0]
        agreeing = [r for r in members if keys[r] == majority]
        for r in members:
            if keys[r] != majority and r not in diverged:
                sig, ref = at[r], at[agreeing[0]]
                diverged[r] = {
                    "rank": r, "index": i,
                    "has": sig.describe(with_seq) if sig is not None else "no collective (its sequence ended)",
                    "expected": ref.describe(with_seq) if ref is not None else "no collective (their sequences end)",
                    "expected_on": agreeing,
                }
        if len(agreeing) < len(members):
            matched = min(matched, i)
    return [diverged[r] for r in sorted(diverged)], matched


def _adjust(seqs: dict[int, list[CollSig]], matched: int, nodes_by_id: dict[int, dict[int, pb.Node]],
            stats: Counter[str], biggest: list[int]) -> None:
    """Collective durations without the wait for the slowest peer (see the module docstring)."""
    for i in range(matched):
        sigs = {r: s[i] for r, s in seqs.items()}
        if any(s.start <= 0 for s in sigs.values()):
            stats["unmeasured"] += 1
            continue  # an unmeasured start says nothing about when the peers were ready
        latest = max(s.start for s in sigs.values())
        if latest >= min(s.end for s in sigs.values()):
            # A member ended before another began: impossible for one collective on one clock, so these are
            # not the same operation (p2p kernels paired by position) or the ranks' clocks differ. Leave them.
            stats["not_overlapping"] += 1
            continue
        for r, sig in sigs.items():
            node = nodes_by_id[r][sig.node]
            measured = sig.end - sig.start
            transfer = max(0, sig.end - latest)
            if measured > 0:
                transfer = max(1, transfer)
            # Never lengthen: on the gloo path the node is only the first period of its op (the rest, waits
            # included, sits in later [self] nodes), so end - latest start can exceed the node's own duration.
            new = min(node.duration_micros, transfer)
            stats["collectives"] += 1
            if new < node.duration_micros:
                stats["adjusted"] += 1
                biggest[0] = max(biggest[0], node.duration_micros - new)
            if measured > node.duration_micros + 1:  # +1: rounding the ends vs rounding the length
                stats["split_ops"] += 1
            node.duration_micros = new
            a = _attr(node, "transfer_duration_micros")
            if a is None:
                a = node.attr.add(name="transfer_duration_micros")
            a.int64_val = new


def assemble_run(outputs: Sequence[dict[str, Any]], allow_mismatch: bool = False,
                 discovery: Discovery | None = None) -> RunResult:
    """Cross-rank work on converted ranks (no I/O): comm groups, pg_name rewrite, sequence check, durations,
    checks. Raises CheckFailed on a check violation; a divergence sets `consistent` (the caller decides)."""
    by_rank: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    for out in outputs:
        if out["rank"] in by_rank:
            raise BadInput(f"rank {out['rank']}", "two inputs convert to the same rank")
        by_rank[out["rank"]] = out
        tr = out["trace_rank"]
        if tr is not None and tr != out["rank"]:
            notes.append(f"rank {out['rank']}: its Kineto trace says rank {tr}; the folder/file name was used")
    worlds = {o["world_size"] for o in outputs if o["world_size"] is not None}
    world = max(worlds) if worlds else None
    if len(worlds) > 1:
        notes.append(f"ranks disagree on the world size ({sorted(worlds)}); used {world}")
    comm_group, ids, group_notes = build_comm_group(outputs, world)
    notes += group_notes

    ranks: dict[int, tuple[pb.GlobalMetadata, list[pb.Node]]] = {}
    rewritten = 0
    for rank in sorted(by_rank):
        metadata, nodes = parse(by_rank[rank]["et"])
        # Local ids (as this rank's converter numbered them) back to trace names, then to the run-wide ids.
        local_to_global: dict[str, str] = {}
        for name, local in by_rank[rank]["local_groups"].items():
            if local and name in ids:
                local_to_global.setdefault(local, ids[name])
        for node in nodes:
            if node.type not in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                continue
            a = _attr(node, "pg_name")
            if a is not None and a.string_val in local_to_global and local_to_global[a.string_val] != a.string_val:
                a.string_val = local_to_global[a.string_val]
                rewritten += 1
        ranks[rank] = (metadata, nodes)

    offsets = _align_rank_starts(ranks)
    present = sorted(ranks)
    world_members = list(range(world)) if world is not None else present
    absent_ranks = sorted(set(present) - set(world_members))
    if absent_ranks:
        notes.append(f"ranks {_range_text(absent_ranks)} are beyond the world size {world}")
        world_members = sorted(set(world_members) | set(present))

    # group id -> rank -> its collectives in ascending id (the order the simulator matches them in)
    seqs: dict[str, dict[int, list[CollSig]]] = {}
    for rank, (_, nodes) in ranks.items():
        for node in sorted((n for n in nodes if n.type == pb.COMM_COLL_NODE), key=lambda n: n.id):
            a = _attr(node, "pg_name")
            gid = a.string_val if a is not None else ""
            seqs.setdefault(gid, {}).setdefault(rank, []).append(_signature(node))

    nodes_by_id = {r: {n.id: n for n in nodes if n.type == pb.COMM_COLL_NODE} for r, (_, nodes) in ranks.items()}
    stats: Counter[str] = Counter()
    biggest = [0]
    groups_report: list[dict[str, Any]] = []
    messages: list[str] = []
    consistent = True
    for gid in sorted(set(seqs) | set(comm_group), key=lambda g: (g != "", int(g) if g.isdecimal() else 0, g)):
        if gid == "":
            members = world_members
        elif gid in comm_group:
            members = comm_group[gid]
        else:
            continue  # an id outside the map: check_run reports it (pg-name)
        here = [r for r in members if r in ranks]
        absent = len(members) - len(here)
        if not here:
            continue
        member_seqs = {r: seqs.get(gid, {}).get(r, []) for r in here}
        divergences, matched = check_sequences(member_seqs)
        _adjust(member_seqs, matched, nodes_by_id, stats, biggest)
        entry: dict[str, Any] = {
            "group": gid, "members": len(members), "present": _range_text(here), "absent": absent,
            "collectives_per_rank": {str(r): len(s) for r, s in member_seqs.items()},
            "matched": matched, "consistent": not divergences, "divergences": divergences,
        }
        groups_report.append(entry)
        label = _group_label(gid)
        if absent:
            notes.append(f"{absent} members of {label} are absent (the run has {len(here)} of {len(members)}: "
                         f"ranks {_range_text(here)}); checked the members present")
        for d in divergences:
            consistent = False
            messages.append(f"{label}: rank {d['rank']} diverges at collective index {d['index']}: it has {d['has']}; "
                            f"rank(s) {_range_text(d['expected_on'])} have {d['expected']}")

    violations: list[Violation] = []
    for rank, (_, nodes) in ranks.items():
        violations += check_nodes(nodes, f"rank {rank}")
    run_notes: list[Violation] = []
    across = check_run({r: nodes for r, (_, nodes) in ranks.items()}, comm_group, run_notes)
    # Ranks that disagree are the user's input, not a broken conversion: the caller fails on them unless told
    # to allow them; every other violation fails the run.
    mismatches = [v for v in across if v.rule in _MISMATCH_RULES]
    violations += [v for v in across if v.rule not in _MISMATCH_RULES]
    if mismatches:
        consistent = False
        messages += [str(v) for v in mismatches]

    report: dict[str, Any] = {
        "etweave_version": __version__,
        "ranks": {str(r): by_rank[r]["report"] for r in sorted(by_rank)},
        "inputs": {str(r): {"host": by_rank[r].get("host"), "kineto": by_rank[r].get("kineto")}
                   for r in sorted(by_rank)},
        "ignored_files": list(discovery.ignored) if discovery else [],
        "world_size": world,
        "comm_group": dict(comm_group),
        "process_group_ids": dict(sorted(ids.items())),
        "pg_name_rewritten": rewritten,
        "rank_start_offsets_micros": {str(r): v for r, v in sorted(offsets.items())},
        "cross_rank": {
            "consistent": consistent,
            "allow_mismatch": allow_mismatch,
            "groups": groups_report,
            "violations": [_as_dict(v) for v in violations],
            "mismatches": [_as_dict(v) for v in mismatches],
            "notes": [_as_dict(v) for v in run_notes],
        },
        "durations": {
            "comm_nodes_matched": stats["collectives"],
            "adjusted": stats["adjusted"],
            "max_adjustment_micros": biggest[0],
            # comm nodes that are only the first period of their op (gloo ops with child ops): their wait partly
            # sits in the op's later [self] nodes, which this adjustment does not touch
            "split_ops": stats["split_ops"],
            "unmeasured_matches": stats["unmeasured"],
            "not_overlapping_matches": stats["not_overlapping"],
        },
        "notes": notes,
    }
    if violations:
        shown = "; ".join(str(v) for v in violations[:_SHOWN])
        more = f" (and {len(violations) - _SHOWN} more)" if len(violations) > _SHOWN else ""
        raise CheckFailed(f"{len(violations)} violation(s) in the converted run, nothing written: {shown}{more}")
    return RunResult(ranks, comm_group, report, consistent, messages)


def _align_rank_starts(ranks: dict[int, tuple[pb.GlobalMetadata, list[pb.Node]]]) -> dict[int, int]:
    """Ranks start their recorded work at different times (dlrm's up to 7 ms apart). A rank that started later
    than the run's first measured instant gets a `[rank start offset]` delay node that its sources (the nodes
    whose only predecessor is the process root, or none) wait for, so a replay starts every rank where it
    started, on one clock. Returns each rank's offset in µs."""
    starts = {r: min((n.start_time_micros for n in nodes if n.start_time_micros > 0), default=0)
              for r, (_, nodes) in ranks.items()}
    measured = [t for t in starts.values() if t > 0]
    if not measured:
        return {}
    run_t0 = min(measured)
    offsets: dict[int, int] = {}
    for rank, (_, nodes) in ranks.items():
        offset = starts[rank] - run_t0 if starts[rank] > 0 else 0
        offsets[rank] = offset
        if offset <= 0:
            continue
        roots = {n.id for n in nodes if n.type == pb.METADATA_NODE and not n.data_deps and not n.ctrl_deps
                 and any(a.name == "kind" and a.string_val == "process_root" for a in n.attr)}
        delay = pb.Node(id=max(n.id for n in nodes) + 1, name="[rank start offset]", type=pb.COMP_NODE,
                        data_deps=sorted(roots), start_time_micros=run_t0, duration_micros=offset)
        delay.attr.add(name="kind", string_val="delay")
        delay.attr.add(name="is_cpu_op", bool_val=True)
        for n in nodes:
            if n.type != pb.METADATA_NODE and set(n.data_deps) <= roots and not n.ctrl_deps:
                n.data_deps.append(delay.id)
            elif n.type == pb.METADATA_NODE and n.id not in roots and set(n.data_deps) <= roots:
                n.data_deps.append(delay.id)  # thread roots: everything on the thread follows them
        nodes.append(delay)
    return offsets


def _as_dict(v: Violation) -> dict[str, Any]:
    return {"rule": v.rule, "where": v.where, "node": v.node, "message": v.message}


# ---------------------------------------------------------------------------------------------- writing


def stale_outputs(out_dir: Path, prefix: str, ranks: Iterable[int]) -> list[Path]:
    """`<prefix>.<N>.et` files in out_dir for ranks not in this run: `etweave check OUT_DIR` would mix them in."""
    if not out_dir.is_dir():
        return []
    keep = {f"{prefix}.{r}.et" for r in ranks}
    pattern = re.compile(rf"^{re.escape(prefix)}\.\d+\.et$")
    return sorted(p for p in out_dir.iterdir() if pattern.match(p.name) and p.name not in keep)


def write_run(out_dir: Path, prefix: str, result: RunResult) -> list[Path]:
    """Every output into a temporary folder inside out_dir, then each renamed into place (report last)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".etweave-run-", dir=out_dir))
    try:
        names: list[str] = []
        for rank, (metadata, nodes) in sorted(result.ranks.items()):
            names.append(f"{prefix}.{rank}.et")
            write_et(stage / names[-1], metadata, nodes)
        write_json(stage / COMM_GROUP_FILE, result.comm_group)
        write_json(stage / REPORT_FILE, result.report)
        names += [COMM_GROUP_FILE, REPORT_FILE]
        for name in names:
            os.replace(stage / name, out_dir / name)
        return [out_dir / n for n in names]
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def convert_run(run_dir: Path, out_dir: Path, prefix: str = "trace", allow_mismatch: bool = False,
                jobs: int | None = None, scheduler: str | None = None, progress: bool = False,
                on_ranks: Callable[[RunResult], None] | None = None) -> RunResult:
    """The whole run (the Python API of `etweave convert-run`). `on_ranks` sees the result before anything is
    written or a divergence raises (the CLI prints its summary there). Raises BadInput, CheckFailed."""
    if not prefix or "/" in prefix or os.sep in prefix:
        raise BadInput("--prefix", f"{prefix!r} must be a plain file name prefix")
    found = discover(Path(run_dir))
    known = [rf.rank for rf in found.ranks if rf.rank is not None]
    stale = stale_outputs(Path(out_dir), prefix, known)
    if stale and all(rf.rank is not None for rf in found.ranks):
        raise BadInput(out_dir, f"holds {len(stale)} .et file(s) of ranks not in this run ("
                                f"{', '.join(p.name for p in stale[:5])}): remove them or choose another "
                                "output folder or --prefix")
    outputs = convert_ranks(found.ranks, jobs, scheduler, progress)
    for out, rf in zip(outputs, found.ranks, strict=True):
        out["host"] = str(rf.host) if rf.host else None
        out["kineto"] = str(rf.kineto) if rf.kineto else None
    result = assemble_run(outputs, allow_mismatch, found)
    if on_ranks is not None:
        on_ranks(result)
    if not result.consistent and not allow_mismatch:
        shown = "; ".join(result.messages[:_SHOWN])
        raise CheckFailed(f"the ranks issue different collectives, nothing written (--allow-mismatch writes "
                          f"anyway): {shown}")
    write_run(Path(out_dir), prefix, result)
    return result


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
    warn = ", ".join(f"{k}={v}" for k, v in (r.get("warnings") or {}).items() if v)
    return (f"rank {rank}: {r.get('nodes', '?')} nodes, {(r.get('edges') or {}).get('total', '?')} edges, host ops "
            f"{ratio('host_ops')}, device ops {ratio('device_ops')}, collectives {ratio('collectives')}, linked by "
            f"{(r.get('link') or {}).get('method', '?')}" + (f", {orphans} orphans" if orphans else "")
            + (f"; warnings: {warn}" if warn else ""))
