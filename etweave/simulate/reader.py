"""Read, from each `.et` node, only the fields the replays use: the loaders' one reader (load.py, astra.py).

A node is parsed by protobuf (upb, in C) with a reduced schema: the Node's own fields as Chakra's, its `attr`
entries kept as their serialized bytes. Only the entries whose name the caller wants are decoded here: the entries
are read in order, each looked up whole in a cache of the entries seen, until as many wanted ones were read as the
nodes with the same first entry and count of entries held before (etweave writes `kind` first, and the attrs the
replays read first, so most nodes read three or four entries; building a protobuf object per attribute, about ten
per node, is what made reading cost twice the decode); then one regex (in C) over the node's bytes after the last
entry read shows that the entries left hold no place that reads as a wanted name field, or they are read too. An
entry read that holds a wanted name is decoded by hand when it has the canonical form every protobuf writer gives
it (the name first, then one value: an integer, bool or string); any other form (another value type, a value before
the name, a doc_string, a malformed entry, a name field twice or with a padded length, a wanted name's bytes inside
another attr's string) sends that node through the full protobuf message instead, so every value reads exactly as
`etweave.chakra.io.attr_value` reads it, and bad bytes fail as `iter_et` fails. A node's name is read as bytes and
decoded (and interned) once per distinct name, the deps as slices of the repeated fields (a list made in C). The
one difference: an entry that holds no wanted name's bytes is never parsed, so a malformed one (which protobuf
would refuse) goes unnoticed here; `etweave check` reads every byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from itertools import chain
from operator import attrgetter
from pathlib import Path
from sys import intern
from typing import Any

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


_CACHE_LIMIT = 1 << 16  # distinct entries kept decoded (a rank repeats a few hundred; ids like part_of never)
_SKIP = ("", None)  # an entry of a name not wanted


def _name_finder(wanted: Collection[str]) -> Callable[[bytes, int], re.Match[bytes] | None]:
    """The first place from a position in some bytes that reads as a wanted name field: tag, length and name,
    the length in one byte (the usual form) or padded to more. Bytes where there is none hold no wanted attr:
    protobuf could read no wanted name in them."""
    encoded = [name.encode() for name in sorted(wanted)]
    by_length: dict[int, list[bytes]] = {}
    for name in encoded:
        by_length.setdefault(len(name), []).append(name)
    # the usual form grouped by its length byte, and a lookahead on that byte first: most fields of a node fail
    # there (the pattern is tried at every b"\n", the tag of each attr entry's name)
    usual = b"|".join(re.escape(bytes([length])) + b"(?:" + b"|".join(map(re.escape, names)) + b")"
                      for length, names in sorted(by_length.items()))
    lengths = b"".join(re.escape(bytes([length])) for length in sorted(by_length) if length < 0x80)
    padded = b"|".join(map(re.escape, encoded)) or b"(?!)"  # (no name wanted: a pattern that never matches)
    return re.compile(rb"\n(?=[" + lengths + rb"\x80-\xff])(?:" + (usual or b"(?!)") + rb"|[\x80-\xff]+[\x00-\x7f](?:"
                      + padded + rb"))").search


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
    a dict of `node.attr` would), a chunk of the file at a time: memory independent of the file's size. Names are
    interned (a run repeats a few hundred over millions of nodes)."""
    metadata, batches = iter_et_raw(path)
    return metadata, chain.from_iterable(_Reader(path, frozenset(wanted)).batches(batches))


class _Reader:
    """One file's nodes, read a batch (a chunk of the file) at a time, with the caches its nodes share."""

    def __init__(self, path: Path, wanted: frozenset[str]) -> None:
        self.path, self.wanted = path, wanted
        self.names = frozenset(name.encode() for name in wanted)
        self.known: dict[bytes, tuple[str, object]] = {}  # entry bytes -> (name, value), or _SKIP: most repeat
        self.node_names: dict[bytes, str] = {}  # a node name's bytes -> the name, interned: names repeat
        self.find_name = _name_finder(wanted)
        # (a node's first attr entry (etweave writes `kind` first), its count of entries) -> the most wanted attrs
        # its nodes held so far. The count too: comm kernels share their first entry with compute kernels, and
        # hold more wanted attrs (on the first alone, every compute kernel would read all its entries)
        self.expect: dict[tuple[bytes, int], int] = {}
        # an entry's head (its wanted name field and a one-byte integer value tag) as an entry decoded before held
        # it -> (the name, the value's conversion): a new value of such a name (part_of: an op's id, new at most
        # nodes that have it) read from the varint after the head, not through `_decode`
        self.int_heads: dict[bytes, tuple[str, Callable[[int], object]]] = {}

    def batches(self, batches: Iterator[list[bytes]]) -> Iterator[list[NodeFields]]:
        """The nodes of each batch; a bad node's error raised once the nodes before it were taken (a caller
        that checks each node meets the first bad one first, as reading one node at a time)."""
        for raws in batches:
            nodes: list[NodeFields] = []
            try:
                self.batch(raws, nodes)
            except BadInput:
                yield nodes
                raise
            yield nodes

    def batch(self, raws: list[bytes], out: list[NodeFields]) -> None:
        """Each node of a batch, in order, appended to `out`."""
        path, wanted, known, node_names = self.path, self.wanted, self.known, self.node_names
        find_name, expect = self.find_name, self.expect
        # one message for the batch, parsed again for each node (a parse clears it first): making one per node
        # costs half as much again as the parse; its arena grows with the batch's nodes and goes with it
        node: Any = _ReducedNode()  # a built class: its fields are not typed
        append = out.append
        for raw in raws:
            try:
                node.ParseFromString(raw)  # (FromString costs twice as much)
            except Exception:
                append(_full(raw, path, wanted))  # raises the error iter_et would
                continue
            node_id, name_bytes, ntype, data_deps, ctrl_deps, start, duration = _fields(node)
            attrs: dict[str, object] = {}
            try:
                name = node_names.get(name_bytes) or _name(name_bytes, node_names)
                # The entries are read in order until as many wanted ones were read as the nodes with the same
                # first entry and count of entries held (etweave writes `kind` first, and the attrs the replays
                # read first: a few are read); then one regex over the node's bytes after the last one read shows
                # that the entries left hold no wanted name (or they are read too). `_decode` reads every entry read.
                found = expected = 0
                first = last = b""
                entries = node.attr
                for entry in entries:
                    hit = known.get(entry) or self.decode(entry)
                    if not first:
                        first = entry
                        shape = (entry, len(entries))
                        expected = expect.get(shape, 0)  # 0: not seen, every entry is read
                    if hit is not _SKIP:
                        attrs[hit[0]] = hit[1]
                        found += 1
                        last = entry
                        if found == expected:
                            # the entries after `last` lie after its first place in the node's bytes
                            if find_name(raw, raw.find(last) + len(last)) is None:
                                break
                            expected = 0
                else:
                    if first and found > expect.get(shape, 0):
                        self.learn(shape, found)
            except _Unusual:
                append(_full(raw, path, wanted))  # raises the error iter_et would for a name that is not UTF-8
                continue
            # (a slice is a list made in C: iterating the repeated field costs twice as much)
            append((node_id, name, ntype, (*data_deps[:], *ctrl_deps[:]) if ctrl_deps else tuple(data_deps[:]),
                    start, duration, attrs))

    def decode(self, entry: bytes) -> tuple[str, object]:
        """An attr entry not seen before (`_decode`, or the varint after a head seen before), kept."""
        if len(self.known) >= _CACHE_LIMIT:
            self.known.clear()
        # (the head: name tag, one-byte length, name, value tag; _decode reads an entry of that head the same way)
        at = 3 + entry[1] if len(entry) > 3 and entry[0] == 0x0A and entry[1] < 0x80 else 0
        if at > len(entry):
            at = 0  # (the name runs to the end or past it: no value tag)
        head = self.int_heads.get(entry[:at]) if at else None
        if head is not None:
            raw, pos = _varint(entry, at)
            if pos == len(entry):
                hit = self.known[entry] = head[0], head[1](raw)
                return hit
        hit = self.known[entry] = _decode(entry, self.names, self.find_name)
        if at and hit is not _SKIP and entry[at - 1] < 0x80:
            convert = _TAGS.get(entry[at - 1:at])
            if convert is not None:
                self.int_heads[entry[:at]] = hit[0], convert
        return hit

    def learn(self, shape: tuple[bytes, int], found: int) -> None:
        """`found` wanted attrs in a node of `shape` (its first attr entry, its count of entries): more than any
        before."""
        if len(self.expect) >= _CACHE_LIMIT:
            self.expect.clear()
        self.expect[shape] = found


_fields = attrgetter("id", "name", "type", "data_deps", "ctrl_deps", "start_time_micros", "duration_micros")


def _name(raw: bytes, names: dict[bytes, str]) -> str:
    """A node name not seen before (or ""), interned and kept; _Unusual when it is not UTF-8 (protobuf refuses
    it: the node is read again by the full message, which says so)."""
    try:
        name = names[raw] = intern(raw.decode())
    except UnicodeDecodeError as exc:
        raise _Unusual from exc
    return name


def _decode(entry: bytes, names: frozenset[bytes], find_name: Callable[[bytes, int], re.Match[bytes] | None]
            ) -> tuple[str, object]:
    """(name, value) of an entry whose name is wanted, _SKIP for one that holds no wanted name (not read
    further: a malformed one goes unnoticed); _Unusual for one that holds a wanted name but not as its one name
    field, first, with a one-byte length (protobuf reads the last name field)."""
    if len(entry) < 2 or entry[0] != 0x0A or entry[1] >= 0x80 or 2 + entry[1] > len(entry):
        if find_name(entry, 0) is None:
            return _SKIP  # (the empty entry too: its name is "")
        raise _Unusual
    at = 2 + entry[1]
    name = entry[2:at]
    if name not in names:
        if find_name(entry, at) is not None:
            raise _Unusual  # a wanted name field after this one, or such bytes in its value
        return _SKIP
    return name.decode(), _value(entry, at)
