"""read/host_et.py: every schema of the host ET into the same `HostOp` records, on small hand-built traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from etweave.errors import BadInput
from etweave.read.host_et import HostOp, read_host_et
from etweave.values import tensors
from tests.unit.build import FLAT_SCHEMA, NESTED_SCHEMA, host_node, host_trace, write_json

OPS = [(10, "aten::mm", 2), (11, "aten::add", 10), (12, "aten::relu", 999)]  # 999: a parent never written


def _read(tmp_path: Path, doc: object, gz: bool = False) -> list[HostOp]:
    return read_host_et(write_json(tmp_path / "host.json", doc, gz=gz)).ops


def _fields(op: HostOp) -> tuple[object, ...]:
    return (op.id, op.name, op.parent, op.et_tid, op.rf_id, op.seq_id, op.op_schema)


@pytest.mark.parametrize("schema", [FLAT_SCHEMA, NESTED_SCHEMA])
def test_schema_fields_become_host_ops(tmp_path: Path, schema: str) -> None:
    ops = _read(tmp_path, host_trace(OPS, schema=schema))
    assert [_fields(op) for op in ops] == [
        (1, "[pytorch|profiler|execution_trace|process]", 1, 1, 0, -1, ""),
        (2, "[pytorch|profiler|execution_trace|thread]", 1, 1, 0, -1, ""),
        (10, "aten::mm", 2, 1, 10, -1, ""),
        (11, "aten::add", 10, 1, 11, -1, ""),
        (12, "aten::relu", 999, 1, 12, -1, ""),  # an orphan keeps the id of its missing parent
    ]
    assert ops[0].is_process_root and ops[1].is_thread_root and not ops[2].is_thread_root


def test_flat_and_nested_read_alike(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    flat = _read(tmp_path / "a", host_trace(OPS, schema=FLAT_SCHEMA))
    nested = _read(tmp_path / "b", host_trace(OPS, schema=NESTED_SCHEMA), gz=True)
    assert [_fields(op) for op in flat] == [_fields(op) for op in nested]


def test_other_attrs_stay_in_extra(tmp_path: Path) -> None:
    doc = host_trace([])
    doc["nodes"].append(host_node(20, "record_param_comms", 2, extra_attrs={"pg_name": "0", "collective_name": "ar"}))
    op = _read(tmp_path, doc)[-1]
    assert op.extra == {"pg_name": "0", "collective_name": "ar"}


def test_mistyped_optional_fields_default(tmp_path: Path) -> None:
    doc = host_trace([])
    doc["nodes"].append(host_node(20, "x", 2, extra_attrs={"rf_id": "7", "seq_id": True, "op_schema": 3}))
    op = _read(tmp_path, doc)[-1]
    assert (op.rf_id, op.seq_id, op.op_schema) == (0, -1, "")


@pytest.mark.parametrize(("node", "message"), [
    ("not a node", "nodes[2] is not an object"),
    ({"name": "x"}, "nodes[2] has no 'id'"),
    ({"id": "3", "name": "x"}, "'id' must be an integer"),
    ({"id": 1 << 63, "name": "x"}, "out of range"),
])
def test_bad_nodes_are_bad_input(tmp_path: Path, node: object, message: str) -> None:
    doc = host_trace([])
    doc["nodes"].append(node)
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        _read(tmp_path, doc)


def test_duplicate_id_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="duplicate node id 10"):
        _read(tmp_path, host_trace([(10, "a", 2), (10, "b", 2)]))


def test_tensors_of_an_op() -> None:
    values = [[5, 6, 0, 12, 4, "cpu"], 3, [[7, 8, 0, 2, 8, "cpu"], [9, 9, 0, 1, 2, "cpu"]]]
    types = ["Tensor(float)", "Int", "GenericList[Tensor(long),Tensor(half)]"]
    assert list(tensors(values, types)) == [(0, 5, 6, 12, 4), (2, 7, 8, 2, 8), (2, 9, 9, 1, 2)]
