"""etweave.simulate.reader against Chakra's full protobuf message: every value type, canonical or not, and bad
bytes failing as iter_et fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import attr_value, iter_et, serialize, varint_bytes
from etweave.errors import BadInput
from etweave.simulate.reader import read_nodes

WANTED = frozenset({"kind", "tid", "device", "stream", "part_of", "is_cpu_op", "comm_size", "pg_name", "weird"})


def _expected(path: Path, wanted: frozenset[str]) -> list[tuple[object, ...]]:
    _, nodes = iter_et(path)
    return [(n.id, n.name, n.type, (*n.data_deps, *n.ctrl_deps), n.start_time_micros, n.duration_micros,
             {a.name: attr_value(a) for a in n.attr if a.name in wanted}) for n in nodes]


def _read(path: Path, wanted: frozenset[str] = WANTED) -> list[tuple[object, ...]]:
    _, nodes = read_nodes(path, wanted)
    return list(nodes)


def _typed(rows: list[tuple[object, ...]]) -> list[object]:
    """Values with their types: True and 1 are equal, but not the same attr value."""
    out: list[object] = []
    for row in rows:
        attrs = row[6]
        assert isinstance(attrs, dict)
        out.append((*row[:6], [(k, type(v), v) for k, v in attrs.items()]))
    return out


def _write(path: Path, nodes: list[pb.Node]) -> Path:
    path.write_bytes(serialize(pb.GlobalMetadata(version="0.0.4"), nodes))
    return path


def _set(node: pb.Node, name: str, field: str, value: Any) -> None:
    attr = node.attr.add(name=name)
    if field.endswith("_list"):
        getattr(attr, field).values.extend(value)
    elif field:
        setattr(attr, field, value)


def _node(i: int, **attrs: tuple[str, Any]) -> pb.Node:
    node = pb.Node(id=i, name=f"op{i}", type=pb.COMP_NODE, data_deps=[i - 1] if i > 1 else [], ctrl_deps=[7, 3],
                   start_time_micros=1_700_000_000_000_000 + i, duration_micros=i * 3)
    for name, (field, value) in attrs.items():
        _set(node, name, field, value)
    return node


def test_every_value_type_reads_as_attr_value(tmp_path: Path) -> None:
    nodes = [
        _node(1, kind=("string_val", "host_op"), tid=("int64_val", -5), device=("int32_val", -2),
              stream=("uint32_val", 2**32 - 1), part_of=("uint64_val", 2**64 - 1), is_cpu_op=("bool_val", False),
              other=("string_val", "not wanted")),
        _node(2, kind=("string_val", "ünï"), tid=("int64_val", 2**63 - 1), weird=("double_val", 1.5)),
        _node(3, weird=("int64_list", [1, 2]), kind=("bytes_val", b"\xff")),
        _node(4, weird=("sint64_val", -3), pg_name=("string_val", "")),
        _node(5, weird=("float_val", 0.25), comm_size=("fixed64_val", 9)),
        _node(6, kind=("", None), tid=("int64_val", 1), tid2=("int64_val", 2)),  # a name with no value
        _node(7, tid=("int64_val", 1), **{"tid ": ("int64_val", 3)}),
        _node(8, tid=("int64_val", 1), device=("bool_val", True)),
    ]
    nodes[6].attr.add(name="tid", int64_val=9)  # a repeated name: the last one wins
    nodes[7].attr.add(name="kind", string_val="x" * 300)  # a long entry (two-byte lengths)
    path = _write(tmp_path / "t.0.et", nodes)
    assert _typed(_read(path)) == _typed(_expected(path, WANTED))


def _raw_node(node_bytes: bytes) -> bytes:
    meta = pb.GlobalMetadata(version="0.0.4").SerializeToString()
    return varint_bytes(len(meta)) + meta + varint_bytes(len(node_bytes)) + node_bytes


def _entry(content: bytes) -> bytes:
    return b"\x52" + varint_bytes(len(content)) + content


@pytest.mark.parametrize("content", [
    b"\x48\x05\x0a\x03tid",  # the value before the name
    b"\x0a\x03tid\x48\x05\x48\x06",  # two values: the last wins
    b"\x0a\x03tid\x12\x03doc\x48\x05",  # a doc_string
    b"\x0a\x03tid\x48\x05\xea\x01\x01x",  # two members of the oneof
    b"\x0a\x04kind\xea\x01\x02\xc3\xa9",  # a two-byte UTF-8 string
    b"\x0a\x03tid\x48\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a ten-byte varint
    b"",  # an attr with nothing set
    b"\x0a\x84\x00kind\xea\x01\x03gpu",  # a name length padded to two bytes
    b"\x0a\x03foo\x0a\x04kind\xea\x01\x03gpu",  # the name field twice: the last counts
    b"\x0a\x03foo\xea\x01\x06\x0a\x04kind",  # a wanted name's bytes inside another attr's string
])
def test_uncommon_encodings_read_as_protobuf_reads_them(tmp_path: Path, content: bytes) -> None:
    node = pb.Node(id=1, name="a", type=pb.COMP_NODE).SerializeToString() + _entry(content)
    path = tmp_path / "t.0.et"
    path.write_bytes(_raw_node(node))
    assert _typed(_read(path)) == _typed(_expected(path, WANTED))


@pytest.mark.parametrize("content", [
    b"\x0a\x04kind\xea\x01\x02\xff\xfe",  # not UTF-8
    b"\x0a\x03tid\x48",  # a varint cut short
    b"\x0a\x04kind\xea\x01\x05ab",  # a string longer than its entry
])
def test_bad_bytes_fail_as_iter_et_fails(tmp_path: Path, content: bytes) -> None:
    node = pb.Node(id=1, name="a", type=pb.COMP_NODE).SerializeToString() + _entry(content)
    path = tmp_path / "t.0.et"
    path.write_bytes(_raw_node(node))
    with pytest.raises(BadInput) as expected:
        _expected(path, WANTED)
    with pytest.raises(BadInput) as got:
        _read(path)
    assert str(got.value) == str(expected.value)


_VALUES = st.one_of(
    st.tuples(st.just("int64_val"), st.integers(-2**63, 2**63 - 1)),
    st.tuples(st.just("uint64_val"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("int32_val"), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just("uint32_val"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("bool_val"), st.booleans()),
    st.tuples(st.just("string_val"), st.text(max_size=200)),
    st.tuples(st.just("double_val"), st.floats(allow_nan=False)),
    st.tuples(st.just("string_list"), st.lists(st.text(max_size=5), max_size=3)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(WANTED | {"x", "kindx"})), _VALUES), max_size=8))
def test_any_attrs_read_as_protobuf_reads_them(tmp_path_factory: pytest.TempPathFactory,
                                               attrs: list[tuple[str, tuple[str, object]]]) -> None:
    node = _node(1)
    for name, (field, value) in attrs:
        _set(node, name, field, value)
    path = _write(tmp_path_factory.mktemp("r") / "t.0.et", [node])
    assert _typed(_read(path)) == _typed(_expected(path, WANTED))


def test_a_malformed_attr_no_one_reads_is_not_checked(tmp_path: Path) -> None:
    """The one difference from protobuf, documented in the module: entries of other names are never parsed."""
    node = pb.Node(id=1, name="a", type=pb.COMP_NODE).SerializeToString() + _entry(b"\x0a\x09tid")
    path = tmp_path / "t.0.et"
    path.write_bytes(_raw_node(node))
    with pytest.raises(BadInput):
        _expected(path, WANTED)
    assert _read(path) == [(1, "a", pb.COMP_NODE, (), 0, 0, {})]


def _stream_cases() -> list[bytes]:
    """Streams of many nodes (so that several chunks are read), cut or broken at the places the framing reads."""
    small = [_node(i, kind=("string_val", "host_op"), tid=("int64_val", i % 3)) for i in range(1, 3000)]
    big = _node(3000, kind=("string_val", "x" * 20_000))  # a three-byte length prefix
    whole = serialize(pb.GlobalMetadata(version="0.0.4"), [*small[:1500], big, *small[1500:]])
    at_big = whole.index(b"x" * 20_000) - 40
    return [whole, whole[:-1], whole[:-300], whole[: at_big + 10], whole[: len(whole) // 2],
            whole[:1_048_577], whole + b"\x85", whole + b"\xff" * 11 + b"\x01",
            whole[:2000] + b"\xff" * 11 + b"\x01" + whole[2000:]]


@pytest.mark.parametrize("case", range(9))
def test_framing_reads_and_fails_as_iter_et(tmp_path: Path, case: int) -> None:
    """Nodes are cut from the stream a chunk at a time (etweave.chakra.io._raw_batches): the same nodes as
    iter_et, and the same error at the same node, whatever the length prefixes and wherever the stream breaks."""
    path = tmp_path / "t.0.et"
    path.write_bytes(_stream_cases()[case])
    try:
        expected: object = _expected(path, WANTED)
    except BadInput as exc:
        expected = str(exc)
    try:
        got: object = _read(path)
    except BadInput as exc:
        got = str(exc)
    assert got == expected


def test_framing_limit_fails_as_iter_et(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.0.et"
    path.write_bytes(_stream_cases()[0])
    monkeypatch.setenv("ETWEAVE_MAX_INPUT_BYTES", "5000")
    with pytest.raises(BadInput) as expected:
        _expected(path, WANTED)
    with pytest.raises(BadInput) as got:
        _read(path)
    assert str(got.value) == str(expected.value)
    assert "input limit" in str(got.value)


def test_nodes_of_one_first_attr_read_as_protobuf_reads_them(tmp_path: Path) -> None:
    """The reader reads a node's attrs up to as many wanted ones as the nodes with the same first attr held
    before, then shows by a regex that the rest hold none: a node holding more, later, or in another order, or
    the wanted name's bytes elsewhere, reads as protobuf reads it."""
    nodes = [_node(1, kind=("string_val", "k"), is_cpu_op=("bool_val", True), tid=("int64_val", 1),
                   other=("int64_val", 5)),
             _node(2, kind=("string_val", "k"), is_cpu_op=("bool_val", True), tid=("int64_val", 2),
                   other=("int64_val", 6), pg_name=("string_val", "g")),  # one more, after an unwanted one
             _node(3, kind=("string_val", "k"), tid=("int64_val", 3), other=("string_val", "\n\x03tid")),
             _node(4, kind=("string_val", "k"), other=("int64_val", 7), tid=("int64_val", 4)),
             _node(5, kind=("string_val", "k")),  # fewer than before
             _node(6, kind=("string_val", "k"), is_cpu_op=("bool_val", True), tid=("int64_val", 6),
                   other=("int64_val", 5), device=("int32_val", 1), stream=("int32_val", 2))]
    nodes[3].attr.add(name="tid", int64_val=9)  # a repeated name, after the first held as many as before
    path = _write(tmp_path / "t.0.et", nodes * 3)
    assert _typed(_read(path)) == _typed(_expected(path, WANTED))


@pytest.mark.parametrize("content", [
    b"\x0a\x09is_cpu_op\x0a\x03tid\x48\x05",  # an unwanted name field, then a wanted one: the last counts
    b"\x48\x05",  # a value with no name: not wanted
])
def test_entries_read_before_the_wanted_ones_read_as_protobuf_reads_them(tmp_path: Path, content: bytes) -> None:
    node = (pb.Node(id=1, name="a", type=pb.COMP_NODE).SerializeToString() + _entry(content)
            + _entry(b"\x0a\x04kind\xea\x01\x01k"))
    path = tmp_path / "t.0.et"
    path.write_bytes(_raw_node(node))
    assert _typed(_read(path)) == _typed(_expected(path, WANTED))


def test_a_malformed_attr_before_a_wanted_one_is_not_checked(tmp_path: Path) -> None:
    """An entry with no wanted name's bytes in it is never parsed, wherever it is."""
    node = (pb.Node(id=1, name="a", type=pb.COMP_NODE).SerializeToString() + _entry(b"\x0a\x09tid")
            + _entry(b"\x0a\x04kind\xea\x01\x01k"))
    path = tmp_path / "t.0.et"
    path.write_bytes(_raw_node(node))
    with pytest.raises(BadInput):
        _expected(path, WANTED)
    assert _read(path) == [(1, "a", pb.COMP_NODE, (), 0, 0, {"kind": "k"})]


@pytest.mark.parametrize("tail", [
    b"",  # a head seen before with no value after it
    b"\x07\x05",  # more fields after the value
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a ten-byte varint
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint past ten bytes
    b"\x80",  # a varint cut short
])
def test_new_values_of_an_integer_attr_read_as_protobuf_reads_them(tmp_path: Path, tail: bytes) -> None:
    """An entry whose head (its name and value tag) an entry read before had is read from its varint alone
    (part_of: a new value at most nodes): every integer type, a value each node, and a head seen before with
    another form after it, read as protobuf reads them."""
    nodes = [_node(i, kind=("string_val", "k"), tid=("int64_val", -i * 1000), device=("int32_val", -i),
                   stream=("uint32_val", 2**32 - i), part_of=("uint64_val", 2**64 - i * 7))
             for i in range(1, 40)]
    body = b"".join(varint_bytes(len(raw)) + raw for raw in (n.SerializeToString() for n in nodes))
    content = b"\x0a\x03tid\x48" + (b"\x05" + tail if tail.startswith(b"\x07") else tail)  # tid's head, then tail
    odd = pb.Node(id=99, name="a", type=pb.COMP_NODE).SerializeToString() + _entry(content)
    meta = pb.GlobalMetadata(version="0.0.4").SerializeToString()
    path = tmp_path / "t.0.et"
    path.write_bytes(varint_bytes(len(meta)) + meta + body + varint_bytes(len(odd)) + odd)
    try:
        expected = _typed(_expected(path, WANTED))
    except BadInput:
        with pytest.raises(BadInput):
            _read(path)
        return
    assert _typed(_read(path)) == expected
