"""Host execution trace reader: every schema (docs/FACTS.md §H1) normalized into `HostOp` records."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson

from etweave.errors import BadInput
from etweave.read import widths
from etweave.read.source import read_bytes

PROCESS_ROOT_NAMES = ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_graph|process]")
THREAD_ROOT_NAMES = ("[pytorch|profiler|execution_trace|thread]", "[pytorch|profiler|execution_graph|thread]")
PG_INIT_NAME = "## process_group:init ##"

# Attributes that are fields of HostOp; every other attr (collective_name, pg_name, ...) stays in `extra`.
_CORE_ATTRS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema")


class IO(msgspec.Struct):
    values: list[Any]
    shapes: list[Any]
    types: list[Any]


class HostOp(msgspec.Struct):
    id: int
    name: str
    parent: int
    et_tid: int
    rf_id: int
    seq_id: int
    fw_parent: int
    fw_tid: int
    scope: int
    op_schema: str
    inputs: IO
    outputs: IO
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def is_process_root(self) -> bool:
        return self.name in PROCESS_ROOT_NAMES

    @property
    def is_thread_root(self) -> bool:
        return self.name in THREAD_ROOT_NAMES


class HostTrace(msgspec.Struct):
    path: str
    schema: str
    pid: int
    ops: list[HostOp]  # sorted by id
    warnings: dict[str, int] = msgspec.field(default_factory=dict)

    def process_groups(self) -> list[dict[str, Any]] | None:
        """The `## process_group:init ##` list, or None when absent or unreadable (counted as a warning). A group
        whose `ranks` is neither a list of ranks nor "all" is bad input."""
        for op in self.ops:
            if op.name == PG_INIT_NAME and op.inputs.values and isinstance(op.inputs.values[0], str):
                try:
                    groups = orjson.loads(op.inputs.values[0])
                except orjson.JSONDecodeError:
                    self.warnings["process_group_init_truncated"] = 1
                    return None
                if not isinstance(groups, list):
                    return None
                check_groups(self.path, f"node {op.id} {PG_INIT_NAME!r}", groups)
                return groups
        return None


def check_groups(path: Path | str, where: str, groups: list[Any]) -> None:
    """Process-group descriptions (host ET `## process_group:init ##`, Kineto `pg_config`): `ranks` is a list of
    ranks, "all", or absent."""
    for n, grp in enumerate(groups):
        if not isinstance(grp, dict):
            continue
        for size_field in ("group_size", "pg_size"):  # a group's size can size a list of its members
            if grp.get(size_field) is not None:
                widths.world_size(path, f"{where}: group {n} '{size_field}'", grp[size_field])
        ranks = grp.get("ranks")
        if ranks is None or ranks == "all":
            continue
        if not isinstance(ranks, list):
            raise BadInput(path, f"{where}: group {n} 'ranks' is {type(ranks).__name__}, not a list of ranks")
        for r in ranks:
            widths.rank(path, f"{where}: group {n} 'ranks' entry", r)


def read_host_et(path: Path) -> HostTrace:
    data = read_bytes(path)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadInput(path, f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise BadInput(path, f"expected a JSON object at top level, found {type(doc).__name__}")
    if "nodes" not in doc:
        if "traceEvents" in doc:
            raise BadInput(path, "this looks like a Kineto trace (has traceEvents), not a host execution trace")
        raise BadInput(path, "not a host execution trace: no 'nodes' list")
    nodes = doc["nodes"]
    if not isinstance(nodes, list):
        raise BadInput(path, "'nodes' is not a list")
    schema = str(doc.get("schema", ""))
    ops = [_op(path, i, n) for i, n in enumerate(nodes)]
    ops.sort(key=lambda op: op.id)
    for a, b in itertools.pairwise(ops):
        if a.id == b.id:
            raise BadInput(path, f"duplicate node id {a.id}")
    pid = doc.get("pid", 0)
    pid = widths.int64(path, "'pid'", pid) if widths.is_int(pid) else 0
    return HostTrace(path=str(path), schema=schema, pid=pid, ops=ops)


def _op(path: Path, index: int, node: Any) -> HostOp:
    node_id, name = _id_and_name(path, index, node)
    nested = "attrs" in node
    attrs: dict[str, Any]
    if nested:  # 1.0.2-chakra and later: parent in ctrl_deps, fields in attrs
        attrs = {a["name"]: a.get("value") for a in _attr_list(path, index, node["attrs"])}
        parent_field = "ctrl_deps"
        inputs, outputs = _io_nested(node.get("inputs")), _io_nested(node.get("outputs"))
    else:  # 1.0.1 flat
        attrs = node
        parent_field = "parent"
        inputs = IO(_list(node.get("inputs")), _list(node.get("input_shapes")), _list(node.get("input_types")))
        outputs = IO(_list(node.get("outputs")), _list(node.get("output_shapes")), _list(node.get("output_types")))
    _check_writable(path, index, node_id, inputs, outputs)
    extra = {k: v for k, v in attrs.items() if k not in _CORE_ATTRS} if nested else {}

    def field(name: str, default: int = 0) -> int:
        value = node.get(name, default) if name == parent_field else attrs.get(name, default)
        # Missing or mistyped optional fields default rather than reject: the field is not needed to keep the op.
        if type(value) is not int:  # bool too
            return default
        if not widths.INT64_MIN <= value <= widths.INT64_MAX:
            widths.int64(path, f"nodes[{index}] (id {node_id}): '{name}'", value)
        return value

    op_schema = attrs.get("op_schema", "")
    return HostOp(
        id=node_id,
        name=name,
        parent=field(parent_field),
        et_tid=field("tid"),
        rf_id=field("rf_id"),
        seq_id=field("seq_id", -1),
        fw_parent=field("fw_parent"),
        fw_tid=field("fw_tid"),
        scope=field("scope"),
        op_schema=op_schema if isinstance(op_schema, str) else "",
        inputs=inputs,
        outputs=outputs,
        extra=extra,
    )


def _id_and_name(path: Path, index: int, node: Any) -> tuple[int, str]:
    if not isinstance(node, dict):
        raise BadInput(path, f"nodes[{index}] is not an object")
    try:
        node_id = node["id"]
        name = node["name"]
    except KeyError as exc:
        raise BadInput(path, f"nodes[{index}] has no {exc.args[0]!r}: unknown schema") from exc
    if not isinstance(node_id, int) or isinstance(node_id, bool) or not isinstance(name, str):
        raise BadInput(path, f"nodes[{index}]: 'id' must be an integer and 'name' a string")
    if node_id < 0 or node_id >= 1 << 63:
        raise BadInput(path, f"nodes[{index}]: id {node_id} out of range")
    return node_id, name


def _check_writable(path: Path, index: int, node_id: int, inputs: IO, outputs: IO) -> None:
    for side, io in (("inputs", inputs), ("outputs", outputs)):
        try:  # the .et IOInfo is JSON written by orjson: what it cannot write is refused here (C-fast check)
            orjson.dumps((io.values, io.shapes, io.types))
        except TypeError as exc:
            raise BadInput(path, f"nodes[{index}] (id {node_id}): '{side}' nested more than "
                                 f"{widths.MAX_NESTING} levels deep") from exc


def _attr_list(path: Path, index: int, attrs: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(attrs, list):
        raise BadInput(path, f"nodes[{index}]: 'attrs' is not a list")
    for j, a in enumerate(attrs):
        if isinstance(a, dict):
            if not isinstance(a.get("name"), str):
                raise BadInput(path, f"nodes[{index}]: attrs[{j}] 'name' is {type(a.get('name')).__name__}, "
                                     "not a string")
            yield a


def _io_nested(io: Any) -> IO:
    if not isinstance(io, dict):
        return IO([], [], [])
    return IO(_list(io.get("values")), _list(io.get("shapes")), _list(io.get("types")))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
