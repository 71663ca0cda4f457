"""Small hand-built inputs for the unit tests: host ET nodes and Kineto events as plain dicts, written to files.

Every builder takes only what a test cares about; the rest gets the values a real trace would have. The files are
written where the test says (pytest's `tmp_path`): unit tests read nothing else."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson

NESTED_SCHEMA = "1.0.3-chakra.0.0.4"  # ctrl_deps + attrs (docs/FACTS.md §H1)
FLAT_SCHEMA = "1.0.1"  # every field at the top level
PROCESS_ROOT = "[pytorch|profiler|execution_trace|process]"
THREAD_ROOT = "[pytorch|profiler|execution_trace|thread]"

Json = dict[str, Any]


def host_node(id: int, name: str, parent: int, *, tid: int = 1, rf_id: int = 0, seq_id: int = -1,
              schema: str = NESTED_SCHEMA, inputs: list[Any] | None = None, input_types: list[str] | None = None,
              extra_attrs: Json | None = None) -> Json:
    """One host ET node in `schema`'s shape (nested attrs, or the flat 1.0.1 layout)."""
    values, types = inputs or [], input_types or []
    shapes: list[Any] = [[] for _ in values]
    fields: Json = {"rf_id": rf_id, "fw_parent": 0, "seq_id": seq_id, "scope": 0, "tid": tid, "fw_tid": 0,
                    "op_schema": "", **(extra_attrs or {})}
    if schema == FLAT_SCHEMA:
        return {"id": id, "name": name, "parent": parent, "inputs": values, "input_shapes": shapes,
                "input_types": types, "outputs": [], "output_shapes": [], "output_types": [], **fields}
    return {"id": id, "name": name, "ctrl_deps": parent,
            "inputs": {"values": values, "shapes": shapes, "types": types},
            "outputs": {"values": [], "shapes": [], "types": []},
            "attrs": [{"name": k, "type": type(v).__name__, "value": v} for k, v in fields.items()]}


def host_trace(ops: list[tuple[int, str, int]], *, schema: str = NESTED_SCHEMA, pid: int = 4242) -> Json:
    """A host ET: the process root (id 1), one thread root (id 2) and `ops` as (id, name, parent)."""
    nodes = [host_node(1, PROCESS_ROOT, 1, schema=schema), host_node(2, THREAD_ROOT, 1, schema=schema)]
    nodes += [host_node(i, name, parent, schema=schema, rf_id=i) for i, name, parent in ops]
    return {"schema": schema, "pid": pid, "time": "2026-12-01 00:00:00", "start_ts": 0, "finish_ts": 0,
            "nodes": nodes}


def kineto_event(name: str, ts: float, dur: float | None, *, cat: str = "cpu_op", tid: int | str = 1,
                 pid: int | str = 4242, ph: str = "X", args: Json | None = None) -> Json:
    """One Chrome-trace event; `dur=None` leaves the duration out (as some real events do)."""
    ev: Json = {"ph": ph, "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts}
    if dur is not None:
        ev["dur"] = dur
    if args is not None:
        ev["args"] = args
    return ev


def kineto_trace(events: list[Json], *, rank: int | None = None, world_size: int | None = None) -> Json:
    doc: Json = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world_size or rank + 1}
    return doc


def write_json(path: Path, doc: object, *, gz: bool = False) -> Path:
    """`doc` as JSON at `path`, gzip-compressed when `gz`."""
    data = orjson.dumps(doc)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path
