"""etweave.chakra.schema: et_def.proto's numbers as plain ints, checked against the generated protobuf module,
and the hand-encoded GlobalMetadata against protobuf's bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra import schema
from etweave.nodes import encode_metadata


def test_node_types_are_protobufs() -> None:
    assert dict(zip(schema.NODE_TYPE_NAMES, range(8), strict=True)) == dict(pb.NodeType.items())
    for name, value in pb.NodeType.items():
        assert getattr(schema, name) == value
        assert schema.node_type_name(value) == pb.NodeType.Name(value)
    with pytest.raises(ValueError):
        schema.node_type_name(len(schema.NODE_TYPE_NAMES))
    with pytest.raises(ValueError):
        schema.node_type_name(-1)


def test_collective_types_are_protobufs() -> None:
    assert dict(zip(schema.COLLECTIVE_NAMES, range(10), strict=True)) == dict(pb.CollectiveCommType.items())
    for name, value in pb.CollectiveCommType.items():
        assert getattr(schema, name) == value


@pytest.mark.parametrize(("fields", "message"), [
    (schema.GLOBAL_METADATA_FIELDS, pb.GlobalMetadata), (schema.NODE_FIELDS, pb.Node),
    (schema.IO_INFO_FIELDS, pb.IOInfo), (schema.ATTRIBUTE_FIELDS, pb.AttributeProto),
])
def test_field_numbers_are_protobufs(fields: dict[str, int], message: type) -> None:
    assert fields == {f.name: f.number for f in message.DESCRIPTOR.fields}


def test_list_values_field_is_protobufs() -> None:
    lists = [m for name, m in pb.DESCRIPTOR.message_types_by_name.items() if name.endswith("List")]
    assert len(lists) == 15
    assert {m.fields_by_name["values"].number for m in lists} == {schema.LIST_VALUES_FIELD}


@pytest.mark.parametrize("attrs", [
    [], [("rank", 0)], [("rank", -1), ("rank", 2**63 - 1), ("rank", -(2**63))],
    [("etweave_version", "0.1.0"), ("rank", 7), ("source_host", ""), ("source_device", "kinéto.json")],
])
def test_metadata_is_protobufs(attrs: list[tuple[str, str | int]]) -> None:
    expected = pb.GlobalMetadata(version="0.0.4")
    for name, value in attrs:
        if isinstance(value, str):
            expected.attr.add(name=name, string_val=value)
        else:
            expected.attr.add(name=name, int64_val=value)
    assert encode_metadata("0.0.4", attrs) == expected.SerializeToString(deterministic=True)


def test_metadata_int_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range for int64"):
        encode_metadata("0.0.4", [("rank", 2**63)])


def test_conversion_imports_no_protobuf() -> None:
    """What keeps a compute-only conversion free of protobuf's import cost: the pipeline and the writer import
    none of it (a later change that imports et_def_pb2 at module level fails here)."""
    code = ("import sys, etweave.cli, etweave.commands.convert_cmd, etweave.convert; "
            "print(sorted(m for m in sys.modules if m.startswith('google.protobuf') or m.endswith('_pb2')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
