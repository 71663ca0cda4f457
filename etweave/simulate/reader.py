"""Read, from each `.et` node, only the fields the replays use: the loaders' one reader (load.py, astra.py).

A node is parsed by protobuf (upb, in C) with a reduced schema: the Node's own fields as Chakra's, its `attr`
entries kept as their serialized bytes. Only the entries whose name the caller wants are decoded here: every
entry of a node is looked up whole, in C (a map over the list of the repeated field), in a cache of the entries
seen (most repeat over a file's nodes); an entry not seen before is decoded once: one that holds no bytes that
read as a wanted name field (tag, length, name; one regex, in C) is of another name and is not read further
(building a protobuf object per attribute, about ten per node, is what made reading cost twice the decode). An
entry of a wanted name is decoded by hand when it has the canonical form every protobuf writer gives it (the
name first, then one value: an integer, bool or string); any other form holding a wanted name field (another
value type, a value before the name, a doc_string, a name field twice or with a padded length, a wanted name's
bytes inside another entry's string) sends that node through the full protobuf message instead, so every value
reads exactly as `etweave.chakra.io.attr_value` reads it, and bad bytes fail as
`iter_et` fails. A node's name is read as bytes and decoded (and interned) once per distinct name, the deps as
slices of the repeated fields (a list made in C). The one difference: the entries of attrs no replay reads are
never parsed, so a malformed one (which protobuf would refuse) goes unnoticed here; `etweave check` reads every
byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from operator import attrgetter
from pathlib import Path
from sys import intern
from typing import Any, cast

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import attr_value, iter_et_raw
from etweave.chakra.reduced import node_class
from etweave.errors import BadInput

# (id, name, type, deps: data_deps then ctrl_deps, start_time_micros, duration_micros, wanted attrs)
NodeFields = tuple[int, str, int, tuple[int, ...], int, int, dict[str, object]]


class _Unusual(Exception):
    """An attr entry not in the canonical form this module decodes: read the node with full protobuf."""


# Chakra's Node with `attr` (field 10) as repeated bytes: the same wire format, no object per attribute; the name
# as bytes, decoded once per distinct name
_ReducedNode = node_class("Node", ("id", "name", "type", "ctrl_deps", "data_deps", "start_time_micros",
                                   "duration_micros", "inputs", "outputs", "attr"),
                          as_bytes=frozenset({"name", "attr"}))


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(unsigned value, position after it); _Unusual when it runs past the entry or past 10 bytes."""
    if pos + 1 < len(buf) and buf[pos + 1] < 0x80:  # two bytes or less (most values: ids, sizes, flags), at once
        low = buf[pos]
        return (low, pos + 1) if low < 0x80 else ((low & 0x7F) | buf[pos + 1] << 7, pos + 2)
    result = shift = 0
    for i in range(pos, min(pos + 10, len(buf))):
        b = buf[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, i + 1
        shift += 7
    raise _Unusual


def _signed64(raw: int) -> int:
    return raw - (1 << 64) if raw >> 63 else raw


def _signed32(raw: int) -> int:
    raw &= 0xFFFFFFFF
    return raw - (1 << 32) if raw >> 31 else raw


# AttributeProto value fields decoded here: tag byte(s) -> the value from the varint after them (None: a string)
_TAGS: dict[bytes, Callable[[int], object] | None] = {
    b"\x48": _signed64,  # int64_val
    b"\x68": int,  # uint64_val
    b"\x38": _signed32,  # int32_val
    b"\x58": lambda raw: raw & 0xFFFFFFFF,  # uint32_val
    b"\xd8\x01": lambda raw: raw != 0,  # bool_val
    b"\xea\x01": None,  # string_val: the varint is its length
}


def _value(entry: bytes, at: int) -> object:
    """The value of an attr entry whose name ends at `at`, as attr_value gives it."""
    if at == len(entry):
        return None  # no value set
    tag = entry[at:at + 1] if entry[at] < 0x80 else entry[at:at + 2]
    if tag not in _TAGS:
        raise _Unusual
    raw, pos = _varint(entry, at + len(tag))
    convert = _TAGS[tag]
    if convert is not None:
        if pos != len(entry):
            raise _Unusual  # more fields after the value
        return convert(raw)
    if pos + raw != len(entry):
        raise _Unusual  # a short string, or more fields after it
    try:
        return intern(entry[pos:].decode())  # kinds, group names: a few distinct values over every node
    except UnicodeDecodeError as exc:
        raise _Unusual from exc


_CACHE_LIMIT = 1 << 16  # distinct entries kept decoded (a rank repeats a few hundred; ids like rf_id never)
_SKIP: tuple[str, object] = cast("tuple[str, object]", ())  # an entry of another name: falsy, so dropped by filter


def _name_finder(wanted: Collection[str]) -> Callable[[bytes], object]:
    """Whether an entry's bytes hold a place that reads as a wanted name field: tag, length and name, the length in
    one byte (the usual form) or padded to more. An entry whose real name (its last name field) is wanted holds
    one; one that holds none is of another name, whatever its form, and is not read further."""
    encoded = [name.encode() for name in sorted(wanted)]
    by_length: dict[int, list[bytes]] = {}
    for name in encoded:
        by_length.setdefault(len(name), []).append(name)
    # the usual form grouped by its length byte, and a lookahead on that byte first
    usual = b"|".join(re.escape(bytes([length])) + b"(?:" + b"|".join(map(re.escape, names)) + b")"
                      for length, names in sorted(by_length.items()))
    lengths = b"".join(re.escape(bytes([length])) for length in sorted(by_length) if length < 0x80)
    padded = b"|".join(map(re.escape, encoded))
    return re.compile(rb"\n(?=[" + lengths + rb"\x80-\xff])(?:" + usual + rb"|[\x80-\xff]+[\x00-\x7f](?:" + padded
                      + rb"))").search


class _Entries(dict[bytes, tuple[str, object]]):
    """Attr entry bytes -> (name, value) of a wanted attr, or _SKIP: most entries repeat over nodes, so
    each distinct one of a file is decoded once, when first looked up (`__missing__`, called from C)."""

    def __init__(self, wanted: frozenset[str]) -> None:
        super().__init__()
        self.names = frozenset(name.encode() for name in wanted)
        self.has_wanted_name = _name_finder(wanted)

    def __missing__(self, entry: bytes) -> tuple[str, object]:
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        hit = self[entry] = _decode(entry, self.names, self.has_wanted_name)
        return hit


def _full(raw: bytes, path: Path, wanted: Collection[str]) -> NodeFields:
    """A node read through Chakra's full protobuf message (the rule every other path must agree with)."""
    node = pb.Node()
    try:
        node.ParseFromString(raw)
    except Exception as exc:  # protobuf's DecodeError, worded as iter_et words it
        raise BadInput(path, f"not a Chakra .et stream: {exc}") from exc
    attrs = {a.name: attr_value(a) for a in node.attr if a.name in wanted}
    return (node.id, intern(node.name), node.type, (*node.data_deps, *node.ctrl_deps), node.start_time_micros,
            node.duration_micros, attrs)


def read_nodes(path: Path, wanted: Collection[str]) -> tuple[pb.GlobalMetadata, Iterator[NodeFields]]:
    """The metadata, and each node's fields with the attrs named in `wanted` (later entries of one name win, as
    a dict of `node.attr` would), one node at a time: memory independent of the file's size. Names are
    interned (a run repeats a few hundred over millions of nodes)."""
    metadata, raws = iter_et_raw(path)
    return metadata, _nodes(raws, path, frozenset(wanted))


def _nodes(raws: Iterator[bytes], path: Path, wanted: frozenset[str]) -> Iterator[NodeFields]:
    new_node: Callable[[], Any] = _ReducedNode  # a built class: its fields are not typed
    fields = attrgetter("id", "name", "type", "data_deps", "ctrl_deps", "start_time_micros", "duration_micros")
    entry_hit = _Entries(wanted).__getitem__
    node_names: dict[bytes, str] = {}  # a node name's bytes -> the name, interned: names repeat over nodes
    for raw in raws:
        node = new_node()
        try:
            node.ParseFromString(raw)  # (FromString costs twice as much)
        except Exception:
            yield _full(raw, path, wanted)  # raises the error iter_et would
            continue
        node_id, name_bytes, ntype, data_deps, ctrl_deps, start, duration = fields(node)
        try:
            name = node_names.get(name_bytes) or _name(name_bytes, node_names)
            # every entry looked up in C, the wanted ones kept (a later one of a name wins, as in a dict of
            # `node.attr`); a list of the repeated field is made in C, an iteration of it step by step
            attrs = dict(filter(None, map(entry_hit, node.attr[:])))
        except _Unusual:
            yield _full(raw, path, wanted)  # raises the error iter_et would for a name that is not UTF-8
            continue
        # (a slice is a list made in C: iterating the repeated field costs twice as much)
        yield (node_id, name, ntype, (*data_deps[:], *ctrl_deps[:]) if ctrl_deps else tuple(data_deps[:]), start,
               duration, attrs)


def _name(raw: bytes, names: dict[bytes, str]) -> str:
    """A node name not seen before (or ""), interned and kept; _Unusual when it is not UTF-8 (protobuf refuses
    it: the node is read again by the full message, which says so)."""
    try:
        name = names[raw] = intern(raw.decode())
    except UnicodeDecodeError as exc:
        raise _Unusual from exc
    return name


def _decode(entry: bytes, names: frozenset[bytes], has_wanted_name: Callable[[bytes], object]) -> tuple[str, object]:
    """(name, value) of an entry whose name is wanted, _SKIP for an entry that holds no wanted name field (its
    value not read); _Unusual for any other: a wanted name not first, or not with a one-byte length, or the bytes
    of one inside an entry of another name."""
    if not has_wanted_name(entry):
        return _SKIP
    if entry[0] != 0x0A or entry[1] >= 0x80 or 2 + entry[1] > len(entry):
        raise _Unusual
    at = 2 + entry[1]
    name = entry[2:at]
    if name not in names:
        raise _Unusual
    return name.decode(), _value(entry, at)
