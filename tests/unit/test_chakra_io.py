"""chakra/io.py: the varint-delimited `.et` stream (docs/FACTS.md §E1), read back as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import comm_type_name
from etweave.chakra.io import (
    decode_varint,
    iter_et,
    node_attrs,
    parse,
    serialize,
    varint_bytes,
    write_et,
)
from etweave.chakra.schema import node_type_name
from etweave.errors import BadInput


def _nodes() -> list[pb.Node]:
    a = pb.Node(id=1, name="a", type=pb.COMP_NODE, duration_micros=5)
    a.attr.add(name="is_cpu_op", bool_val=True)
    b = pb.Node(id=2, name="b", type=pb.COMM_COLL_NODE, data_deps=[1])
    b.attr.add(name="comm_size", int64_val=1 << 40)
    b.attr.add(name="involved_dim", bool_list=pb.BoolList(values=[True, False]))
    return [a, b]


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, (1 << 64) - 1])
def test_varint_round_trip(value: int) -> None:
    data = varint_bytes(value)
    assert decode_varint(data + b"\x00", 0) == (value, len(data))


def test_stream_round_trip(tmp_path: Path) -> None:
    metadata = pb.GlobalMetadata(version="0.0.4")
    data = serialize(metadata, _nodes())
    assert data[0] == len(metadata.SerializeToString())  # each message after its length
    got_meta, got_nodes = parse(data)
    assert got_meta == metadata and got_nodes == _nodes()
    for name in ("t.et", "t.et.gz"):
        write_et(tmp_path / name, metadata, _nodes())
        meta, nodes = iter_et(tmp_path / name)
        assert meta == metadata and list(nodes) == _nodes()
    assert (tmp_path / "t.et.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_truncated_stream_is_bad_input() -> None:
    data = serialize(pb.GlobalMetadata(version="0.0.4"), _nodes())
    with pytest.raises(BadInput, match="truncated message"):
        parse(data[:-3])
    with pytest.raises(BadInput, match="empty file"):
        parse(b"")


def test_attrs_and_enum_names() -> None:
    assert node_attrs(_nodes()[1]) == {"comm_size": 1 << 40, "involved_dim": [True, False]}
    assert (node_type_name(pb.COMM_COLL_NODE), comm_type_name(pb.ALL_GATHER)) == ("COMM_COLL_NODE", "ALL_GATHER")
    with pytest.raises(ValueError):
        node_type_name(99)
    assert comm_type_name(99) == "99"  # an unknown type is named by its number in a message
