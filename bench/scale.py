"""Scaled traces for benchmarks: a real host ET + Kineto pair with its Kineto trace replicated K times.

Copy k of every Kineto event is shifted in time by k * (span of the trace + a gap), and every id-like field is
offset by k * (its maximum + 1), one stride per id space, so that copies never collide and every reference
(correlation -> runtime call, flow id, External id, Sequence number <-> host seq_id) stays inside its copy.
Metadata events (ph "M") are written once. Output is plain JSON (or gzip with --gzip), streamed chunk by chunk
so that the K-times document never exists in memory.

The host ET is kept as it is by default ("single"): it covers one iteration and links to that iteration in
copy 0, exactly as on the base pair. "replicate" copies it K times too (node, tensor and storage ids, parents,
rf_id and seq_id offset per copy; the process and thread roots and the process-group node written once), but
today's aligner walks one contiguous stretch of each Kineto thread, so it links host copy k > 0 to the next
iterations of copy 0 (by name, seq-less ops) instead of to copy k: use it for reader and future-linker tests.

    python -m bench.scale --k 10 --out /tmp/scaled
    python -m bench.scale --target-bytes 1000000000 --out /tmp/scaled [--gzip] [--host-mode replicate]
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from etweave.values import tensors

REPO = Path(__file__).resolve().parents[1]
GAP_US = 1000  # idle time between copies, so that no copy overlaps the previous one's GPU tail
CHUNK = 4096  # events serialized per write
HOST_MODES = ("single", "replicate")

# Kineto args that name something in the one id space shared by External id, correlation and flow ids.
ID_ARGS = ("External id", "correlation", "wait_on_cuda_event_record_corr_id", "Python id", "Python parent id")
FLOW_KEYS = ("id", "bind_id")
RF_ARG, SEQ_ARG, IDX_ARG = "Record function id", "Sequence number", "Ev Idx"

ROOT_NAMES = frozenset({
    "[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_graph|process]",
    "[pytorch|profiler|execution_trace|thread]", "[pytorch|profiler|execution_graph|thread]",
    "## process_group:init ##",
})


def traces_dir() -> Path:
    return Path(os.environ.get("ETWEAVE_TRACES", REPO.parent / "shared" / "traces"))


def base_pair() -> tuple[Path, Path]:
    d = traces_dir() / "gpu" / "linear"
    return d / "host.json.gz", d / "kineto.json.gz"


def load_json(path: Path) -> Any:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return orjson.loads(data)


def _int(v: Any) -> int | None:
    """Kineto writes some ids as numbers and some as decimal strings."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isdecimal():
        return int(v)
    return None


def _add(v: Any, off: int, lowest: int = 0) -> Any:
    """v + off in v's own type; values below `lowest` (0 = "none" for rf ids, -1 = no seq) stay as they are."""
    n = _int(v)
    if n is None or n < lowest or off == 0:
        return v
    return str(n + off) if isinstance(v, str) else n + off


@dataclass(slots=True)
class Strides:
    """Per-copy offsets. rf and seq are shared with the host ET so that its copies match the Kineto copies."""

    period_us: int  # time shift per copy
    ids: int  # External id, correlation, flow ids
    rf: int  # Record function id <-> host rf_id
    seq: int  # Sequence number <-> host seq_id
    ev_idx: int
    host_ids: int  # host node, tensor and storage ids (one counter in the ET observer)


def _host_nodes(host: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = host.get("nodes")
    return nodes if isinstance(nodes, list) else []


def _attrs(node: dict[str, Any]) -> dict[str, Any]:
    """A node's core fields: top level in schema 1.0.1, the `attrs` list from 1.0.2 on."""
    if isinstance(node.get("attrs"), list):
        return {a.get("name"): a.get("value") for a in node["attrs"] if isinstance(a, dict)}
    return node


def _io(node: dict[str, Any], side: str) -> tuple[list[Any], list[Any]]:
    io = node.get(side)
    if isinstance(io, dict):  # 1.0.2+: {values, shapes, types}
        return io.get("values") or [], io.get("types") or []
    return io if isinstance(io, list) else [], node.get(f"{side[:-1]}_types") or []


def _tensor_ids(values: list[Any], types: list[Any]) -> Iterator[int]:
    """Tensor and storage ids of an op's inputs or outputs (malformed nodes may lack types: the rest skipped)."""
    for _, tensor, storage, _, _ in tensors(values, types):
        yield tensor
        yield storage


def strides(kineto: dict[str, Any], host: dict[str, Any] | None) -> Strides:
    lo, hi = math.inf, -math.inf
    ids = rf = seq = idx = 0
    for ev in kineto.get("traceEvents", []):
        ts = ev.get("ts")
        if isinstance(ts, (int, float)) and ev.get("ph") != "M":
            lo = min(lo, ts)
            hi = max(hi, ts + (ev.get("dur") or 0))
        for key in FLOW_KEYS:
            ids = max(ids, _int(ev.get(key)) or 0)
        args = ev.get("args")
        if isinstance(args, dict):
            for key in ID_ARGS:
                ids = max(ids, _int(args.get(key)) or 0)
            rf = max(rf, _int(args.get(RF_ARG)) or 0)
            seq = max(seq, _int(args.get(SEQ_ARG)) or 0)
            idx = max(idx, _int(args.get(IDX_ARG)) or 0)
    host_ids = 0
    for node in _host_nodes(host or {}):
        a = _attrs(node)
        rf = max(rf, _int(a.get("rf_id")) or 0)
        seq = max(seq, _int(a.get("seq_id")) or 0)
        host_ids = max(host_ids, _int(node.get("id")) or 0, _int(node.get("parent", node.get("ctrl_deps"))) or 0,
                       _int(a.get("fw_parent")) or 0)
        for side in ("inputs", "outputs"):
            host_ids = max(host_ids, *_tensor_ids(*_io(node, side)), 0)
    span = hi - lo if hi > lo else 0
    return Strides(period_us=math.ceil(span) + GAP_US, ids=ids + 1, rf=rf + 1, seq=seq + 1, ev_idx=idx + 1,
                   host_ids=host_ids + 1)


def shift_event(ev: dict[str, Any], k: int, s: Strides) -> dict[str, Any]:
    """Copy k of a Kineto event (a new dict; the base event is not touched)."""
    e = dict(ev)
    ts = e.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        e["ts"] = ts + k * s.period_us
    for key in FLOW_KEYS:
        if key in e:
            e[key] = _add(e[key], k * s.ids)
    args = e.get("args")
    if isinstance(args, dict):
        a = dict(args)
        for key in ID_ARGS:
            if key in a:
                a[key] = _add(a[key], k * s.ids)
        if RF_ARG in a:
            a[RF_ARG] = _add(a[RF_ARG], k * s.rf, lowest=1)
        if SEQ_ARG in a:
            a[SEQ_ARG] = _add(a[SEQ_ARG], k * s.seq)
        if IDX_ARG in a:
            a[IDX_ARG] = _add(a[IDX_ARG], k * s.ev_idx)
        e["args"] = a
    return e


def _write_head(f: IO[bytes], doc: dict[str, Any], list_key: str) -> None:
    """Every top-level key but the big list, then the list's opening bracket."""
    f.write(b"{")
    for key, value in doc.items():
        if key != list_key:
            f.write(orjson.dumps(key) + b":" + orjson.dumps(value) + b",")
    f.write(orjson.dumps(list_key) + b":[")


class _ListWriter:
    """Writes list items in chunks, with the commas between chunks."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.first, self.count = f, True, 0

    def write(self, items: list[dict[str, Any]]) -> None:
        if not items:
            return
        if not self.first:
            self.f.write(b",")
        self.f.write(orjson.dumps(items)[1:-1])
        self.first = False
        self.count += len(items)


def _open(path: Path) -> IO[bytes]:
    # Level 1: the fastest gzip; tell() still counts uncompressed bytes, which is what target_bytes means.
    return gzip.open(path, "wb", compresslevel=1) if path.suffix == ".gz" else open(path, "wb")


def write_kineto(kineto: dict[str, Any], s: Strides, path: Path, k: int | None = None,
                 target_bytes: int | None = None) -> tuple[int, int, int]:
    """Write copies 0..k-1 (or until the uncompressed file reaches target_bytes); returns (copies, events,
    uncompressed bytes). A `.gz` path is written gzip-compressed."""
    events: list[dict[str, Any]] = kineto.get("traceEvents", [])
    copies = 0
    with _open(path) as f:
        _write_head(f, kineto, "traceEvents")
        out = _ListWriter(f)
        while (k is not None and copies < k) or (k is None and target_bytes is not None
                                                 and f.tell() + 2 < target_bytes):
            c = copies
            for start in range(0, len(events), CHUNK):
                chunk = events[start:start + CHUNK]
                out.write(chunk if c == 0 else [shift_event(e, c, s) for e in chunk if e.get("ph") != "M"])
            copies += 1
        f.write(b"]}")
        size = f.tell()
    return copies, out.count, size


@dataclass(slots=True)
class _Shift:
    """How copy k moves a host ET node's references: ids by k strides, the written-once roots kept."""

    k: int
    s: Strides
    once: set[int]

    def ref(self, v: Any) -> Any:
        n = _int(v)
        return v if n is None or n in self.once or n == 0 else n + self.k * self.s.host_ids

    def attr(self, name: str, v: Any) -> Any:
        if name == "rf_id":
            return _add(v, self.k * self.s.rf, lowest=1)
        if name == "seq_id":
            return _add(v, self.k * self.s.seq)
        if name == "fw_parent":
            return self.ref(v)
        return v


def shift_node(node: dict[str, Any], k: int, s: Strides, once: set[int]) -> dict[str, Any]:
    """Copy k of a host ET node: ids offset, references to the written-once roots kept."""
    off = k * s.host_ids
    shift = _Shift(k, s, once)
    n = dict(node)
    n["id"] = node["id"] + off
    for key in ("parent", "ctrl_deps"):
        if key in n:
            n[key] = shift.ref(n[key])
    if isinstance(node.get("attrs"), list):
        n["attrs"] = [dict(a, value=shift.attr(a.get("name", ""), a.get("value"))) if isinstance(a, dict) else a
                      for a in node["attrs"]]
    else:
        for key in ("rf_id", "seq_id", "fw_parent"):
            if key in n:
                n[key] = shift.attr(key, n[key])
    for side in ("inputs", "outputs"):
        _shift_io(node, n, side, off)
    return n


def _shift_io(node: dict[str, Any], n: dict[str, Any], side: str, off: int) -> None:
    """The tensors among `node`'s inputs or outputs with their tensor and storage ids offset, into `n`."""
    values, types = _io(node, side)
    moved = [_move_tensors(v, off) if isinstance(t, str) and "Tensor" in t else v
             for v, t in zip(values, types, strict=False)]
    moved += values[len(moved):]  # values without a type: kept as they are
    if isinstance(node.get(side), dict):
        n[side] = dict(node[side], values=moved)
    elif side in n:
        n[side] = moved


def _move_tensors(value: Any, off: int) -> Any:
    if isinstance(value, list):
        if len(value) == 6 and all(isinstance(x, int) and not isinstance(x, bool) for x in value[:5]):
            return [value[0] + off, value[1] + off, *value[2:]]
        return [_move_tensors(v, off) for v in value]
    return value


def write_host(host: dict[str, Any], s: Strides, path: Path, k: int) -> tuple[int, int]:
    """Write k copies of the host ET's nodes (roots once); returns (nodes, uncompressed bytes)."""
    nodes = _host_nodes(host)
    once = {n["id"] for n in nodes if n.get("name") in ROOT_NAMES and isinstance(n.get("id"), int)}
    with _open(path) as f:
        _write_head(f, host, "nodes")
        out = _ListWriter(f)
        for c in range(k):
            for start in range(0, len(nodes), CHUNK):
                chunk = nodes[start:start + CHUNK]
                out.write(chunk if c == 0 else [shift_node(n, c, s, once) for n in chunk if n["id"] not in once])
        f.write(b"]}")
        size = f.tell()
    return out.count, size


@dataclass(slots=True)
class ScaledPair:
    host: Path
    kineto: Path
    k: int
    host_mode: str
    host_bytes: int  # uncompressed
    kineto_bytes: int  # uncompressed
    host_nodes: int
    kineto_events: int


def scale(out_dir: Path, k: int | None = None, target_bytes: int | None = None, host_mode: str = "single",
          base: tuple[Path, Path] | None = None, compress: bool = False) -> ScaledPair:
    """Write `host.json` and `kineto.json` (`.json.gz` with compress) with K copies, or with the first K whose
    uncompressed Kineto reaches target_bytes."""
    if (k is None) == (target_bytes is None):
        raise ValueError("give exactly one of k and target_bytes")
    if k is not None and k < 1:
        raise ValueError("k must be at least 1")
    if host_mode not in HOST_MODES:
        raise ValueError(f"host_mode must be one of {HOST_MODES}")
    host_path, kineto_path = base or base_pair()
    host, kineto = load_json(host_path), load_json(kineto_path)
    s = strides(kineto, host)
    out_dir.mkdir(parents=True, exist_ok=True)
    ext = ".json.gz" if compress else ".json"
    kout, hout = out_dir / f"kineto{ext}", out_dir / f"host{ext}"
    copies, events, kbytes = write_kineto(kineto, s, kout, k=k, target_bytes=target_bytes)
    del kineto
    nodes, hbytes = write_host(host, s, hout, copies if host_mode == "replicate" else 1)
    return ScaledPair(host=hout, kineto=kout, k=copies, host_mode=host_mode, host_bytes=hbytes,
                      kineto_bytes=kbytes, host_nodes=nodes, kineto_events=events)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--k", type=int, help="number of copies")
    size.add_argument("--target-bytes", type=int, help="the first K whose uncompressed Kineto reaches this size")
    p.add_argument("--out", type=Path, required=True, help="folder for host.json and kineto.json")
    p.add_argument("--host-mode", choices=HOST_MODES, default="single",
                   help="keep the host ET as it is (default; it links to copy 0) or replicate it with the Kineto "
                        "trace (the aligner then links host copies > 0 to the wrong iteration: see the docstring)")
    p.add_argument("--gzip", action="store_true", help="write .json.gz (gzip level 1) instead of plain JSON")
    args = p.parse_args(argv)
    pair = scale(args.out, k=args.k, target_bytes=args.target_bytes, host_mode=args.host_mode,
                 compress=args.gzip)
    print(orjson.dumps(asdict(pair), default=str).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
