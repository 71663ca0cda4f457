"""Build nodes (after the STAGES): items and their incoming edges into Chakra nodes (docs/FACTS.md §E).

Nodes are encoded straight to protobuf wire bytes (`encode_nodes`), the bytes `Node.SerializeToString(
deterministic=True)` gives for the same message: building a protobuf object per node and per attr cost most of a
conversion's time. The encoding is plain proto3: fields in field-number order, scalars at their default left out
(`id`, `name`, `type`, times; oneof attr values always written), repeated integers packed, submessages as their
length and bytes. `build_nodes` gives the same nodes as protobuf objects (the Python API, tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, repeat
from operator import add, attrgetter, itemgetter, sub
from typing import TYPE_CHECKING, NamedTuple

import orjson

from etweave.chakra import schema
from etweave.chakra.io import BYTE_VARINTS, LOW_14_MORE, VARINTS_14, varint_bytes
from etweave.deps import Dependencies
from etweave.model import GPU_KINDS, HOST_OP, PROCESS_ROOT, THREAD_ROOT, Comm, Edge, Graph, Item, OpRecord
from etweave.read.host_et import IO, PG_INIT_NAME
from etweave.roofline import Roofline

if TYPE_CHECKING:
    from etweave.chakra import et_def_pb2 as pb

DEP_EVIDENCE = "dep_evidence"


def _tid(tid: int | str | None) -> int:
    # Kineto thread ids are ints except on odd synthetic tracks; a non-integer one keeps a stable small hash.
    if isinstance(tid, int):
        return tid
    # (the sum of ord(c) * 31**i mod 2**31, computed with the modulus at every step: linear, not quadratic)
    h, power = 0, 1
    for c in str(tid):
        h = (h + ord(c) * power) % (1 << 31)
        power = power * 31 % (1 << 31)
    return h


# The `kind` attr of the `## process_group:init ##` node: its item is a host op, but it stands for no work.
PG_INIT_KIND = "process_group_init"
# The `kind` attr values of nodes that stand for no work: zero-length COMP_NODEs (METADATA_NODE in older outputs).
MARKER_KINDS = frozenset({PROCESS_ROOT, THREAD_ROOT, PG_INIT_KIND})


def is_marker_node(node_type: int, kind: str) -> bool:
    """A written node that stands for no work, by its type and `kind` attr: replays give it no time, what-if
    edits and timelines leave it out."""
    return node_type == schema.METADATA_NODE or kind in MARKER_KINDS


def is_marker(it: Item) -> bool:
    """Roots and `## process_group:init ##`: nodes that stand for no work (Chakra calls them metadata)."""
    return it.kind in _ROOT_KINDS or (it.kind == HOST_OP and it.name == PG_INIT_NAME)


_ROOT_KINDS = (PROCESS_ROOT, THREAD_ROOT)


def node_type(it: Item) -> int:
    # Markers are COMP_NODEs of zero duration, as Chakra's converter writes roots: ASTRA-sim aborts on a
    # METADATA_NODE (docs/FACTS.md §A1). Their role stays in the `kind` attr.
    return it.comm.node_type if it.comm is not None else schema.COMP_NODE


def duration(it: Item) -> int:
    """µs of the node's own period. Rounding both ends (not the length) keeps a thread's chain of periods summing
    to its measured span instead of drifting by half a µs per node."""
    kind = it.kind
    if kind in _ROOT_KINDS or (kind == HOST_OP and it.name == PG_INIT_NAME):  # is_marker, inline: called per node
        return 0
    d = round(it.seg_end) - round(it.start)
    return d if d > 0 else 0


def on_gpu(it: Item) -> bool:
    """GPU events, and idle time on a stream: not CPU ops (`is_cpu_op` false)."""
    return it.kind in GPU_KINDS or it.stream is not None


class Rounded(NamedTuple):
    """Every item's start rounded to the µs, and its seg_end rounded less that, in item order: what its node's times
    are made of (the audit's passes and the encoder share them; `round` of a float is one of the dearest steps per
    node)."""

    start: list[int]  # (lists: int64 arrays would hold less, but box every time again each time it is read)
    # round(seg_end) - round(start), negative where seg_end rounds below start: held, not the rounded ends, as most
    # lengths are small ints Python shares where each end was an int of its own (7 MB on a trace of 224k items)
    length: list[int]

    @classmethod
    def of(cls, items: list[Item]) -> Rounded:
        starts = list(map(round, map(_START, items)))
        return cls(starts, list(map(sub, map(round, map(_SEG_END, items)), starts)))


_START, _SEG_END = attrgetter("start"), attrgetter("seg_end")


# ---- the wire format (protobuf's encoding, proto3) ----

_U64 = 1 << 64
_I64_MIN, _I64_END = -(1 << 63), 1 << 63
_I32_MIN, _I32_END = -(1 << 31), 1 << 31
_BYTE = BYTE_VARINTS
_V14, _MORE14 = VARINTS_14, LOW_14_MORE
_WIRE_VARINT, _WIRE_LEN = 0, 2
_varint = varint_bytes


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_BYTE[n] if n < 0x80 else _varint(n)) + payload


def _text(s: str) -> bytes:
    return s.encode("utf-8")


_NODE = schema.NODE_FIELDS
_N_ID, _N_NAME, _N_TYPE = (_tag(_NODE[f], _WIRE_VARINT if f != "name" else _WIRE_LEN)
                           for f in ("id", "name", "type"))
_N_DATA_DEPS = _tag(_NODE["data_deps"], _WIRE_LEN)  # packed
_N_START, _N_DURATION = (_tag(_NODE[f], _WIRE_VARINT) for f in ("start_time_micros", "duration_micros"))
_N_INPUTS, _N_OUTPUTS, _N_ATTR = (_tag(_NODE[f], _WIRE_LEN) for f in ("inputs", "outputs", "attr"))
_IO_FIELDS = schema.IO_INFO_FIELDS
_IO_VALUES, _IO_SHAPES, _IO_TYPES = (_tag(_IO_FIELDS[f], _WIRE_LEN) for f in ("values", "shapes", "types"))
_ATTR_FIELDS = schema.ATTRIBUTE_FIELDS
_A_NAME = _tag(_ATTR_FIELDS["name"], _WIRE_LEN)
_LIST_VALUES = _tag(schema.LIST_VALUES_FIELD, _WIRE_LEN)


def _key(name: str, oneof: str) -> bytes:
    """An attr's bytes before its value: its name, then the tag of its oneof field."""
    wire = _WIRE_LEN if oneof in ("string_val", "string_list") else _WIRE_VARINT
    return _len_field(_A_NAME, _text(name)) + _tag(_ATTR_FIELDS[oneof], wire)


def _attr(key: bytes, value: bytes) -> bytes:
    """One `attr` entry of a Node: its tag, length and the AttributeProto's bytes."""
    return _len_field(_N_ATTR, key + value)


def _string_attr(key: bytes, value: str) -> bytes:
    return _attr(key, _len_field(b"", _text(value)))


_M_VERSION, _M_ATTR = (_tag(schema.GLOBAL_METADATA_FIELDS[f], _WIRE_LEN) for f in ("version", "attr"))


def encode_metadata(version: str, attrs: Sequence[tuple[str, str | int]]) -> bytes:
    """A GlobalMetadata's bytes: `version`, then each attr, a str as `string_val` and an int as `int64_val`."""
    parts = [_len_field(_M_VERSION, _text(version))] if version else []
    for name, value in attrs:
        if isinstance(value, str):
            body = _key(name, "string_val") + _len_field(b"", _text(value))
        elif _I64_MIN <= value < _I64_END:
            body = _key(name, "int64_val") + _signed_varint(value)
        else:
            raise ValueError(f"value out of range for int64: {value}")
        parts.append(_len_field(_M_ATTR, body))
    return b"".join(parts)


_IntAttr = Callable[[int], bytes]
_RANGES = {"int64_val": (_I64_MIN, _I64_END), "uint64_val": (0, _U64), "int32_val": (_I32_MIN, _I32_END)}


def _int_attr(name: str, oneof: str = "int64_val") -> _IntAttr:
    """The encoder of one integer attr: value -> the Node's `attr` entry. 0..127 and -1 are encoded once."""
    key = _key(name, oneof)
    low, end = _RANGES[oneof]
    kind = oneof.removesuffix("_val")
    common = {v: _attr(key, _signed_varint(v)) for v in [*range(0x80), -1] if low <= v}
    # the entry's length fits one byte: the key and at most ten bytes of varint
    prefixes = [_attr_prefix(key, n) for n in range(11)]
    two, three = prefixes[2], prefixes[3]

    def encode(value: int) -> bytes:
        if 0x4000 <= value < 1 << 21:  # ids, correlations: three bytes, split as in EncodedNodes._batch_function
            return three + _MORE14[value & 0x3FFF] + _BYTE[value >> 14]
        entry = common.get(value)
        if entry is not None:
            return entry
        if 0x80 <= value < 0x4000:
            return two + _V14[value]
        if not low <= value < end:
            raise ValueError(f"value out of range for {kind}: {value}")
        encoded = _signed_varint(value)
        return prefixes[len(encoded)] + encoded

    return encode


def _attr_prefix(key: bytes, n: int) -> bytes:
    """The bytes of an `attr` entry before an n-byte varint value: its tag, its length and `key`."""
    return _N_ATTR + _varint(len(key) + n) + key


def _signed_varint(value: int) -> bytes:
    """int64 and int32 alike: a negative value as its 64-bit two's complement (ten bytes)."""
    return _varint(value if value >= 0 else value + _U64)


def _io(io: IO) -> tuple[str, str, str]:
    dumps = orjson.dumps
    return dumps(io.values).decode(), dumps(io.shapes).decode(), dumps(io.types).decode()


def _io_bytes(tag: bytes, values: str, shapes: str, types: str) -> bytes:
    """An IOInfo field, present even when its strings are empty (as `CopyFrom` of an empty message sets it)."""
    payload = b"".join(_len_field(t, _text(s)) for t, s in ((_IO_VALUES, values), (_IO_SHAPES, shapes),
                                                               (_IO_TYPES, types)) if s)
    return _len_field(tag, payload)


_NO_IO = _io_bytes(_N_INPUTS, "[]", "[]", "[]") + _io_bytes(_N_OUTPUTS, "[]", "[]", "[]")  # no values, shapes, types

# attrs, each with the oneof field its value uses (chakra.accepts.ATTR_TYPES for those it names)
_KIND, _IS_CPU_OP = _key("kind", "string_val"), _key("is_cpu_op", "bool_val")
_TID, _DEVICE, _STREAM = _int_attr("tid"), _int_attr("device"), _int_attr("stream")
_ET_TID, _ET_PARENT, _RF_ID, _SEQ_ID = (_int_attr(n) for n in ("et_tid", "et_parent", "rf_id", "seq_id"))
_OP_SCHEMA, _PG_CONFIG = _key("op_schema", "string_val"), _key("pg_config", "string_val")
_EXCLUSIVE, _PART_OF = _int_attr("exclusive_micros"), _int_attr("part_of")
_ORPHAN_PARENT, _CORRELATION = _int_attr("orphan_parent"), _int_attr("correlation")
_NUM_OPS, _TENSOR_SIZE = _int_attr("num_ops"), _int_attr("tensor_size", "uint64_val")
_COLLECTIVE_NAME, _PG_NAME = _key("collective_name", "string_val"), _key("pg_name", "string_val")
_COMM_TYPE, _COMM_SIZE, _COMM_SEQ = _int_attr("comm_type"), _int_attr("comm_size"), _int_attr("comm_seq")
_COMM_SRC, _COMM_DST, _COMM_TAG = (_int_attr(n, "int32_val") for n in ("comm_src", "comm_dst", "comm_tag"))
_MEASURED, _RECORD_TAIL = _int_attr("measured_duration_micros"), _int_attr("record_tail_micros")
_LINKED = {flag: _attr(_key("linked", "bool_val"), _BYTE[flag]) for flag in (False, True)}
_EVIDENCE = _key(DEP_EVIDENCE, "string_list")
_NO_WORK = _NUM_OPS(0) + _TENSOR_SIZE(0)  # num_ops and tensor_size 0: not known
_TYPES: dict[int, bytes] = {t: _N_TYPE + _varint(t) if t else b"" for t in range(len(schema.NODE_TYPE_NAMES))}
_COMP = schema.COMP_NODE


_DATA_DEPS_3 = _N_DATA_DEPS + _BYTE[3]  # the data_deps field's tag and length, of one dep of three bytes
_DURATIONS = [_N_DURATION + v for v in _BYTE]  # the duration field of 0..127 µs, most nodes'
_BATCH = 1024  # nodes encoded at a time: one Python call each, not one per node
_NODE_BYTES = itemgetter(slice(1, None, 2))  # a batch's nodes, less their length prefixes
_CACHE_CAP = 1 << 16  # a cache keyed by values that may all differ stops growing here: its memory stays bounded


def _uint64(value: int) -> bytes:
    """The varint of a uint64 field's value."""
    if not 0 <= value < _U64:
        raise ValueError(f"value out of range for uint64: {value}")
    return _varint(value)


class _Shape(NamedTuple):
    """What nodes of one name, kind, type and place share."""

    head: bytes  # the name and type fields
    place: bytes  # the kind, is_cpu_op and tid (or device and stream) attrs
    marker: bool  # stands for no work: duration 0
    pg_init: bool  # the `## process_group:init ##` node
    host_op: bool  # of kind HOST_OP: its exclusive time is an attr when measured
    in_full: bool  # not a plain COMP_NODE: the self-check decodes and checks it in full (`EncodedNodes.in_full`)


# part_of and correlation before a three-byte value (ids and correlations: EncodedNodes._attrs writes them inline)
_PART_OF_3, _CORRELATION_3 = (_attr_prefix(_key(name, "int64_val"), 3) for name in ("part_of", "correlation"))


@functools.cache
def _more_tables() -> tuple[list[bytes], ...]:
    """The bytes of the id, start_time_micros, data_deps (one dep), part_of and correlation fields up to the last
    byte of a value 0x4000 <= v < 2**28 (2**21 for the three-byte ones), by v & 0x3FFF: one part where the tag and
    `_MORE14` would be two. Made on first use (16384 entries each, 0.6 MB; commands that encode nothing import
    this module too)."""
    return tuple(list(map(add, repeat(prefix), _MORE14))
                 for prefix in (_N_ID, _N_START, _DATA_DEPS_3, _PART_OF_3, _CORRELATION_3))


class EncodedNodes:
    """One conversion's nodes, encoded lazily in item order as they are taken (iterate it once), so the writer can
    stream them; GPU COMP nodes take num_ops and tensor_size from `roofline` (zeros without). Once all are taken,
    it holds what the self-check reads of them (`check.NodeChecker.add_encoded`), kept as they go (each item is at
    hand then; a pass over the items after would reach each again): `ids`, `starts` (the items' measured starts)
    and `data_deps`, each node's in node order, and `in_full`, the bytes of the nodes that are not plain COMP nodes
    (comm nodes and `## process_group:init ##`).

    One loop per batch of nodes (`_batch_function`) writes the fields in number order with the common cases inline,
    each node after its length prefix (`framed`: the .et stream's framing); it caches the
    bytes that repeat across nodes (name, type and place per `_Shape`, evidence lists, the high bits of times, a host
    op's exclusive time and its rf_id/seq_id/linked attrs by their values). A
    varint of 0x4000 <= v < 2**64 is written as two parts, `_MORE14[v & 0x3FFF]` and the varint of v >> 14: a table
    entry while v < 2**28 (ids), else a cache (times in µs since the epoch share their high bits)."""

    def __init__(self, g: Graph, deps: Dependencies, roofline: Roofline | None = None, times: Rounded | None = None
                 ) -> None:
        self.items = g.items
        self.times = times
        self.ids: list[int] = []
        self.starts: list[float] = []  # (each item's start as measured, not rounded)
        self.data_deps: list[tuple[int, ...]] = []
        self.in_full: list[bytes] = []
        self.work = roofline.values if roofline is not None else {}
        self.shapes: dict[tuple[object, ...], _Shape] = {}  # comm nodes', by (name, kind, type, tid, device, stream)
        self.comp_shapes: dict[tuple[object, ...], _Shape] = {}  # the others' (COMP nodes), by the same less the type
        self.evidence: dict[tuple[str, ...], bytes] = {}
        self.evidence1: dict[str, bytes] = {}  # the same for one data_dep, by its source
        self.high: dict[int, bytes] = {}  # v >> 14 -> its varint, for v >= 2**28
        self.et_tids: dict[int, bytes] = {}  # the et_tid attr, by value (one per thread)
        self.record_ids: dict[tuple[int, int, bool], bytes] = {}  # rf_id, seq_id and linked, by their values
        self.exclusive: dict[float, bytes] = {}  # exclusive_micros, by the measured float (round once per value)
        self.deps = deps

    def __iter__(self) -> Iterator[bytes]:
        # (batches chained in C: no generator step per node, and one Python call per batch, not per node)
        return chain.from_iterable(map(_NODE_BYTES, self._batches()))

    def framed(self, done: Callable[[int], object] | None = None) -> Iterator[bytes]:
        """The nodes as the .et stream has them after its GlobalMetadata (`chakra.io.framed_et_chunks`): each after
        its length, a batch of them joined at a time, framed as they are encoded (a writer's Python step per node
        cost 4% of the writing stage). `done`: called with each batch's count of nodes (progress)."""
        if done is None:
            return map(b"".join, self._batches())

        def joined(parts: list[bytes]) -> bytes:
            done(len(parts) >> 1)
            return b"".join(parts)

        return map(joined, self._batches())

    def _batches(self) -> Iterator[list[bytes]]:
        """Each batch of `_BATCH` nodes (the last: the rest), as each node's length prefix then its bytes."""
        if self.data_deps:  # (what the self-check reads is kept as the nodes go: twice would be wrong)
            raise RuntimeError("a conversion's nodes are encoded once")
        items, times = self.items, self.times or Rounded.of(self.items)
        if not len(items) == len(times.start) == len(times.length):
            raise ValueError(f"{len(times.start)} rounded times for {len(items)} items")
        return map(self._batch_function(items, times), range(0, len(items), _BATCH))

    def _batch_function(self, items: list[Item], times: Rounded) -> Callable[[int], list[bytes]]:  # noqa: C901
        """The encoder of the `_BATCH` nodes from item k on (`_batches`): a loop over them with the tables and caches
        in locals (no attribute lookup, no call per node). The common case is written inline, the rarer ones as
        expressions or helpers (few branches, no call for most)."""
        preds_of, shape_of, new_shape = self.deps.preds.get, self.shapes.get, self._shape
        comp_shape_of = self.comp_shapes.get
        evidence1, new_evidence, other_deps = self.evidence1, self._evidence, self._other_deps
        high_of, new_high, host_fields = self.high.get, self._high, self._host
        exclusive_of, new_exclusive = self.exclusive.get, self._exclusive
        work_of = self.work.get if self.work else None  # (no roofline values: every COMP node's work is unknown)
        add_deps, add_full = self.data_deps.append, self.in_full.append
        add_id, add_start = self.ids.append, self.starts.append
        starts, lengths = times.start, times.length
        tables = _more_tables()

        def encode(k: int) -> list[bytes]:  # noqa: C901 (one loop, the fields inline: measured, see below)
            end = k + _BATCH
            out: list[bytes] = []
            add = out.append
            id_more, start_more, dep_more, part_more, corr_more = tables  # (locals: the loop reads them per node)
            v14, byte, durations, no_work = _V14, _BYTE, _DURATIONS, _NO_WORK
            # (start, length: `Rounded`'s)
            for it, start, length in zip(items[k:end], starts[k:end], lengths[k:end], strict=True):
                # each field in locals, joined once (a tuple of as many parts whatever the node: b"" where none)
                iid = it.id
                add_id(iid)
                add_start(it.start)
                comm = it.comm
                shape = ((comp_shape_of((it.name, it.kind, it.tid, it.device, it.stream)) or new_shape(it, _COMP))
                         if comm is None  # (most nodes: a key of five, the node type known)
                         else _comm_shape(it, comm.node_type, shape_of, new_shape))
                head, place, marker, _, host_op, in_full = shape  # (unpacked: a NamedTuple's fields are slow)
                # (statements, not conditional expressions of tuples: a tuple made and unpacked per field cost 8%)
                if 0x4000 <= iid < 1 << 28:
                    id_a, id_b = id_more[iid & 0x3FFF], v14[iid >> 14]
                else:
                    id_a, id_b = _id_field(iid), b""
                preds = preds_of(iid, ())
                if len(preds) == 1:  # most nodes
                    edge = preds[0]
                    src = edge.src
                    if 0x4000 <= src < 1 << 21:
                        dep_a, dep_b = dep_more[src & 0x3FFF], byte[src >> 14]
                    else:
                        dep_a, dep_b = _one_dep(src), b""
                    add_deps((src,))
                    # (`_value_`: the member's plain attribute, not the `value` property; strings hash fast)
                    source = edge.source._value_
                    evidence = evidence1.get(source) or new_evidence((source,))
                else:
                    dep_a, dep_b, evidence = other_deps(preds)
                if marker:  # duration(): 0; its start 0 when it has none
                    rounded, dur = (start if it.measured or it.start > 0 else 0), 0
                else:  # duration(): both ends rounded
                    rounded, dur = start, length
                if 1 << 28 <= rounded < _U64:  # start_time_micros
                    start_a, start_b = start_more[rounded & 0x3FFF], high_of(rounded >> 14) or new_high(rounded)
                else:
                    start_a, start_b = (_N_START + _uint64(rounded) if rounded > 0 else b""), b""  # (0 left out)
                host = it.host
                # the attrs after the place and host attrs, but `dep_evidence`, in the order the node has them
                value = it.part_of
                if value is None:
                    part_a = part_b = b""
                elif 0x4000 <= value < 1 << 21:
                    part_a, part_b = part_more[value & 0x3FFF], byte[value >> 14]
                else:
                    part_a, part_b = _PART_OF(value), b""
                value = it.correlation
                if value is None:
                    corr_a = corr_b = b""
                elif 0x4000 <= value < 1 << 21:  # runtime calls
                    corr_a, corr_b = corr_more[value & 0x3FFF], byte[value >> 14]
                else:
                    corr_a, corr_b = _CORRELATION(value), b""
                data = b"".join((
                    id_a, id_b, head, dep_a, dep_b, start_a, start_b,
                    durations[dur] if 0 < dur < 0x80 else b"" if dur <= 0 else _N_DURATION + _uint64(dur),
                    place if host is None else host_fields(it, host, shape),
                    (exclusive_of(it.excl) or new_exclusive(it.excl)) if host_op and it.measured else b"",
                    part_a, part_b,
                    b"" if it.orphan_parent is None else _ORPHAN_PARENT(it.orphan_parent),
                    corr_a, corr_b,
                    # a COMP node's num_ops and tensor_size (ASTRA-sim's roofline mode throws on a COMP_NODE without
                    # both, docs/FACTS.md §A3; 0 = not known), or a comm node's attrs
                    ((no_work if work_of is None else _work(work_of(iid))) if comm is None
                     else _comm_attrs(comm, it.dur) + (_work(self.work.get(iid)) if comm.node_type == _COMP else b"")),
                    evidence,  # why each data_dep is there, in data_deps order (docs/OUTPUT.md); b"": none
                ))
                if in_full:
                    add_full(data)
                n = len(data)  # the .et stream's length prefix (io.stream_encoded's, inline)
                add(byte[n] if n < 0x80 else v14[n] if n < 0x4000 else _varint(n))
                add(data)
            return out

        return encode

    def _other_deps(self, preds: tuple[Edge, ...]) -> tuple[bytes, bytes, bytes]:
        """The data_deps field of no dep (none) or more than one, b"" (`node`'s second part of it), and their
        `dep_evidence` attr."""
        if not preds:
            self.data_deps.append(())
            return b"", b"", b""
        data_deps = tuple([e.src for e in preds])
        self.data_deps.append(data_deps)
        payload = b"".join([_MORE14[src & 0x3FFF] + _BYTE[src >> 14] if 0x4000 <= src < 1 << 21 else _uint64(src)
                            for src in data_deps])
        sources = tuple([e.source._value_ for e in preds])
        return _len_field(_N_DATA_DEPS, payload), b"", self.evidence.get(sources) or self._evidence(sources)

    def _high(self, value: int) -> bytes:
        """The varint of value >> 14 (2**28 <= value < 2**64), cached."""
        encoded = _varint(value >> 14)
        if len(self.high) < _CACHE_CAP:
            self.high[value >> 14] = encoded
        return encoded

    def _evidence(self, sources: tuple[str, ...]) -> bytes:
        """The `dep_evidence` attr: few distinct combinations occur, each encoded once."""
        values = b"".join(_len_field(_LIST_VALUES, _text(s)) for s in sources)
        encoded = self.evidence[sources] = _attr(_EVIDENCE, _len_field(b"", values))
        if len(sources) == 1:
            self.evidence1[sources[0]] = encoded
        return encoded

    def _shape(self, it: Item, ntype: int) -> _Shape:
        """The `_Shape` of `it`'s nodes, made once per combination."""
        name, kind = it.name, it.kind
        pg_init = kind == HOST_OP and name == PG_INIT_NAME
        marker = kind in _ROOT_KINDS or pg_init  # is_marker
        head = (_len_field(_N_NAME, _text(name)) if name else b"") + _TYPES[ntype]
        shape = _Shape(head, _place(it, PG_INIT_KIND if pg_init else kind), marker, pg_init, kind == HOST_OP,
                       ntype != _COMP or name == PG_INIT_NAME)
        if it.comm is None:
            self.comp_shapes[(name, kind, it.tid, it.device, it.stream)] = shape
        else:
            self.shapes[(name, kind, ntype, it.tid, it.device, it.stream)] = shape
        return shape

    def _host(self, it: Item, host: OpRecord, shape: _Shape) -> bytes:
        """A host op's IOInfo fields and attrs (`place` between them, as the node has them)."""
        pg_init = shape.pg_init
        et_tid = self.et_tids.get(host.et_tid) or self._et_tid(host.et_tid)
        ids = (host.rf_id, host.seq_id, it.measured)  # (few combinations: rf_id 0, seq_id -1 on most)
        out = [_host_io(host, pg_init), shape.place, et_tid, _ET_PARENT(host.et_parent),
               self.record_ids.get(ids) or self._record_ids(ids)]
        if host.op_schema:
            out.append(_string_attr(_OP_SCHEMA, host.op_schema))
        if pg_init:
            out.append(_string_attr(_PG_CONFIG, _io(host.inputs)[0]))
        return b"".join(out)

    def _record_ids(self, ids: tuple[int, int, bool]) -> bytes:
        """The rf_id, seq_id and linked attrs of a host op's node, cached by their values."""
        encoded = _RF_ID(ids[0]) + _SEQ_ID(ids[1]) + _LINKED[ids[2]]
        if len(self.record_ids) < _CACHE_CAP:
            self.record_ids[ids] = encoded
        return encoded

    def _exclusive(self, excl: float) -> bytes:
        """The exclusive_micros attr of a measured host op's node, cached by its float (few distinct values)."""
        encoded = _EXCLUSIVE(round(excl))
        if len(self.exclusive) < _CACHE_CAP:
            self.exclusive[excl] = encoded
        return encoded

    def _et_tid(self, et_tid: int) -> bytes:
        encoded = _ET_TID(et_tid)
        if len(self.et_tids) < _CACHE_CAP:
            self.et_tids[et_tid] = encoded
        return encoded


def _comm_shape(it: Item, ntype: int, shape_of: Callable[[tuple[object, ...]], _Shape | None],
                new_shape: Callable[[Item, int], _Shape]) -> _Shape:
    """The `_Shape` of a comm item's node (`EncodedNodes.shapes`, by name, kind, type and place)."""
    return shape_of((it.name, it.kind, ntype, it.tid, it.device, it.stream)) or new_shape(it, ntype)


def _work(work: tuple[int, int] | None) -> bytes:
    """The num_ops and tensor_size attrs of a COMP node, of its roofline values (None: both 0, not known)."""
    return _NO_WORK if work is None else _NUM_OPS(work[0]) + _TENSOR_SIZE(work[1])


def _id_field(value: int) -> bytes:
    """The id field of an id that is not 0x4000 <= id < 2**28."""
    return _N_ID + _V14[value] if 0 < value < 0x4000 else _uint64_field(_N_ID, value)


def _one_dep(src: int) -> bytes:
    """The data_deps field of one dep that is not 0x4000 <= dep < 2**21."""
    payload = _V14[src] if 0 <= src < 0x4000 else _uint64(src)
    return _N_DATA_DEPS + _BYTE[len(payload)] + payload


def _place(it: Item, kind: str) -> bytes:
    """The `kind` and `is_cpu_op` attrs, then the thread (`tid`) or the device and stream."""
    gpu = it.kind in GPU_KINDS or it.stream is not None  # on_gpu
    parts = [_string_attr(_KIND, kind), _attr(_IS_CPU_OP, _BYTE[it.comm is None and not gpu])]
    if gpu:
        parts += [_DEVICE(it.device or 0), _STREAM(it.stream or 0)]
    elif it.tid is not None:
        parts.append(_TID(_tid(it.tid)))
    return b"".join(parts)


def _uint64_field(tag: bytes, value: int) -> bytes:
    """A uint64 field: left out at 0, as proto3 does."""
    if not 0 <= value < _U64:
        raise ValueError(f"value out of range for uint64: {value}")
    return tag + _varint(value) if value else b""


def _host_io(host: OpRecord, pg_init: bool) -> bytes:
    """The inputs and outputs IOInfo fields of a host op's node."""
    inputs, outputs = host.inputs, host.outputs
    if not (pg_init or inputs.values or inputs.shapes or inputs.types or outputs.values or outputs.shapes
            or outputs.types):
        return _NO_IO
    values, shapes, types = _io(inputs)
    # ASTRA-sim parses this node's inputs.values as `substr(2, size-4)` JSON whose group names would
    # replace comm_group.json's ids (docs/FACTS.md §A1): leave it empty, keep the host ET's list in an attr.
    return _io_bytes(_N_INPUTS, "" if pg_init else values, shapes, types) + _io_bytes(_N_OUTPUTS, *_io(outputs))


def _comm_attrs(c: Comm, dur: float) -> bytes:
    attrs = [_string_attr(_COLLECTIVE_NAME, c.collective_name), _COMM_TYPE(c.comm_type), _COMM_SIZE(c.size),
             _string_attr(_PG_NAME, c.pg_name)]
    if c.seq is not None:
        attrs.append(_COMM_SEQ(c.seq))
    if c.src is not None:
        attrs += [_COMM_SRC(c.src), _COMM_DST(c.dst or 0), _COMM_TAG(c.tag or 0)]
    if c.record_tail:  # the record outlasted the collective (docs/FACTS.md §W3): `dur` ends at its completion
        attrs += [_MEASURED(max(0, round(dur + c.record_tail))), _RECORD_TAIL(round(c.record_tail))]
    else:
        attrs.append(_MEASURED(max(0, round(dur))))
    return b"".join(attrs)


def encode_nodes(g: Graph, deps: Dependencies, roofline: Roofline | None = None, times: Rounded | None = None
                 ) -> EncodedNodes:
    """Each node's protobuf bytes in ascending id, encoded lazily (`EncodedNodes`; `times`: the items' times
    rounded, when the caller has them)."""
    return EncodedNodes(g, deps, roofline, times)


def build_nodes(g: Graph, deps: Dependencies, roofline: Roofline | None = None) -> Iterator[pb.Node]:
    """The nodes of `encode_nodes` as protobuf objects."""
    from etweave.chakra import et_def_pb2 as pb  # here: encoding needs no protobuf

    for data in encode_nodes(g, deps, roofline):
        yield pb.Node.FromString(data)
