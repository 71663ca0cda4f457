"""Build nodes (after the STAGES): items and their incoming edges into Chakra nodes (docs/FACTS.md §E).

Nodes are encoded straight to protobuf wire bytes (`encode_nodes`), the bytes `Node.SerializeToString(
deterministic=True)` gives for the same message: building a protobuf object per node and per attr cost most of a
conversion's time. The encoding is plain proto3: fields in field-number order, scalars at their default left out
(`id`, `name`, `type`, times; oneof attr values always written), repeated integers packed, submessages as their
length and bytes. `build_nodes` gives the same nodes as protobuf objects (the Python API, tests).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.deps import Dependencies
from etweave.model import GPU_KINDS, HOST_OP, PROCESS_ROOT, THREAD_ROOT, Comm, Graph, Item, OpRecord
from etweave.read.host_et import IO, PG_INIT_NAME
from etweave.roofline import Roofline

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
    return node_type == pb.METADATA_NODE or kind in MARKER_KINDS


def is_marker(it: Item) -> bool:
    """Roots and `## process_group:init ##`: nodes that stand for no work (Chakra calls them metadata)."""
    return it.kind in (PROCESS_ROOT, THREAD_ROOT) or (it.kind == HOST_OP and it.name == PG_INIT_NAME)


def node_type(it: Item) -> pb.NodeType.ValueType:
    # Markers are COMP_NODEs of zero duration, as Chakra's converter writes roots: ASTRA-sim aborts on a
    # METADATA_NODE (docs/FACTS.md §A1). Their role stays in the `kind` attr.
    if it.comm is not None:
        return cast("pb.NodeType.ValueType", it.comm.node_type)  # Comm holds the plain int
    return pb.COMP_NODE


def duration(it: Item) -> int:
    """µs of the node's own period. Rounding both ends (not the length) keeps a thread's chain of periods summing
    to its measured span instead of drifting by half a µs per node."""
    if is_marker(it):
        return 0
    d = round(it.seg_end) - round(it.start)
    return d if d > 0 else 0


def on_gpu(it: Item) -> bool:
    """GPU events, and idle time on a stream: not CPU ops (`is_cpu_op` false)."""
    return it.kind in GPU_KINDS or it.stream is not None


# ---- the wire format (protobuf's encoding, proto3) ----

_U64 = 1 << 64
_I64_MIN, _I64_END = -(1 << 63), 1 << 63
_I32_MIN, _I32_END = -(1 << 31), 1 << 31
_BYTE = [bytes((i,)) for i in range(128)]  # one-byte varints
_WIRE_VARINT, _WIRE_LEN = 0, 2


def _varint(value: int) -> bytes:
    """Base-128 varint of 0 <= value < 2**64 (callers check the field's range)."""
    if value < 0x80:
        return _BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uint64(value: int) -> bytes:
    if not 0 <= value < _U64:
        raise ValueError(f"value out of range for uint64: {value}")
    return _varint(value)


def _int64(value: int) -> bytes:
    if value >= 0:
        if value >= _I64_END:
            raise ValueError(f"value out of range for int64: {value}")
        return _varint(value)
    if value < _I64_MIN:
        raise ValueError(f"value out of range for int64: {value}")
    return _varint(value + _U64)  # negative: two's complement, ten bytes


def _int32(value: int) -> bytes:
    if not _I32_MIN <= value < _I32_END:
        raise ValueError(f"value out of range for int32: {value}")
    return _varint(value if value >= 0 else value + _U64)  # negative int32 is sign-extended to 64 bits


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _text(s: str) -> bytes:
    return s.encode("utf-8")


_NODE = pb.Node.DESCRIPTOR.fields_by_name
_N_ID, _N_NAME, _N_TYPE = (_tag(_NODE[f].number, _WIRE_VARINT if f != "name" else _WIRE_LEN)
                           for f in ("id", "name", "type"))
_N_DATA_DEPS = _tag(_NODE["data_deps"].number, _WIRE_LEN)  # packed
_N_START, _N_DURATION = (_tag(_NODE[f].number, _WIRE_VARINT) for f in ("start_time_micros", "duration_micros"))
_N_INPUTS, _N_OUTPUTS, _N_ATTR = (_tag(_NODE[f].number, _WIRE_LEN) for f in ("inputs", "outputs", "attr"))
_IO_FIELDS = pb.IOInfo.DESCRIPTOR.fields_by_name
_IO_VALUES, _IO_SHAPES, _IO_TYPES = (_tag(_IO_FIELDS[f].number, _WIRE_LEN) for f in ("values", "shapes", "types"))
_ATTR_FIELDS = pb.AttributeProto.DESCRIPTOR.fields_by_name
_A_NAME = _tag(_ATTR_FIELDS["name"].number, _WIRE_LEN)
_LIST_VALUES = _tag(pb.StringList.DESCRIPTOR.fields_by_name["values"].number, _WIRE_LEN)


def _key(name: str, oneof: str) -> bytes:
    """An attr's bytes before its value: its name, then the tag of its oneof field."""
    wire = _WIRE_LEN if oneof in ("string_val", "string_list") else _WIRE_VARINT
    return _len_field(_A_NAME, _text(name)) + _tag(_ATTR_FIELDS[oneof].number, wire)


def _attr(key: bytes, value: bytes) -> bytes:
    """One `attr` entry of a Node: its tag, length and the AttributeProto's bytes."""
    return _len_field(_N_ATTR, key + value)


def _string_attr(key: bytes, value: str) -> bytes:
    return _attr(key, _len_field(b"", _text(value)))


def _io(io: IO) -> tuple[str, str, str]:
    dumps = orjson.dumps
    return dumps(io.values).decode(), dumps(io.shapes).decode(), dumps(io.types).decode()


def _io_bytes(tag: bytes, values: str, shapes: str, types: str) -> bytes:
    """An IOInfo field, present even when its strings are empty (as `CopyFrom` of an empty message sets it)."""
    payload = b"".join(_len_field(t, _text(s)) for t, s in ((_IO_VALUES, values), (_IO_SHAPES, shapes),
                                                               (_IO_TYPES, types)) if s)
    return _len_field(tag, payload)


# attr keys, each with the oneof field its value uses (chakra.accepts.ATTR_TYPES for those it names)
_KIND = _key("kind", "string_val")
_TID, _DEVICE, _STREAM = _key("tid", "int64_val"), _key("device", "int64_val"), _key("stream", "int64_val")
_ET_TID, _ET_PARENT = _key("et_tid", "int64_val"), _key("et_parent", "int64_val")
_RF_ID, _SEQ_ID = _key("rf_id", "int64_val"), _key("seq_id", "int64_val")
_OP_SCHEMA, _PG_CONFIG = _key("op_schema", "string_val"), _key("pg_config", "string_val")
_EXCLUSIVE, _PART_OF = _key("exclusive_micros", "int64_val"), _key("part_of", "int64_val")
_ORPHAN_PARENT, _CORRELATION = _key("orphan_parent", "int64_val"), _key("correlation", "int64_val")
_NUM_OPS, _TENSOR_SIZE = _key("num_ops", "int64_val"), _key("tensor_size", "uint64_val")
_COLLECTIVE_NAME, _COMM_TYPE = _key("collective_name", "string_val"), _key("comm_type", "int64_val")
_COMM_SIZE, _PG_NAME, _COMM_SEQ = _key("comm_size", "int64_val"), _key("pg_name", "string_val"), \
    _key("comm_seq", "int64_val")
_COMM_SRC, _COMM_DST, _COMM_TAG = (_key(n, "int32_val") for n in ("comm_src", "comm_dst", "comm_tag"))
_MEASURED = _key("measured_duration_micros", "int64_val")
_IS_CPU_OP = {flag: _attr(_key("is_cpu_op", "bool_val"), _BYTE[flag]) for flag in (False, True)}
_LINKED = {flag: _attr(_key("linked", "bool_val"), _BYTE[flag]) for flag in (False, True)}
_EVIDENCE = _key(DEP_EVIDENCE, "string_list")
_NO_WORK = _attr(_NUM_OPS, _BYTE[0]) + _attr(_TENSOR_SIZE, _BYTE[0])  # num_ops and tensor_size 0: not known


class _Encoder:
    """Encodes one conversion's nodes; caches the bytes that repeat across nodes (names, kinds, evidence lists)."""

    def __init__(self, deps: Dependencies, roofline: Roofline | None) -> None:
        self.preds = deps.preds
        self.work = roofline.values if roofline is not None else {}
        self.names: dict[str, bytes] = {}
        self.kinds: dict[str, bytes] = {}
        self.evidence: dict[tuple[str, ...], bytes] = {}

    def node(self, it: Item) -> tuple[bytes, int, tuple[int, ...]]:
        """(the node's bytes, its type, its data_deps)."""
        preds = self.preds.get(it.id, ())
        data_deps = tuple(e.src for e in preds)
        ntype = node_type(it)
        name = self.names.get(it.name)
        if name is None:
            name = self.names[it.name] = _len_field(_N_NAME, _text(it.name)) if it.name else b""
        out = [_N_ID + _uint64(it.id) if it.id else b"", name, _N_TYPE + _varint(ntype) if ntype else b""]
        if data_deps:
            out.append(_len_field(_N_DATA_DEPS, b"".join([_uint64(d) for d in data_deps])))
        start = max(0, round(it.start)) if it.measured or it.start > 0 else 0
        if start:
            out.append(_N_START + _uint64(start))
        dur = duration(it)
        if dur:
            out.append(_N_DURATION + _uint64(dur))
        self._attrs(it, out)
        if ntype == pb.COMP_NODE:
            # ASTRA-sim's roofline mode throws on a COMP_NODE without both (docs/FACTS.md §A3); 0 = not known
            work = self.work.get(it.id)
            out.append(_NO_WORK if work is None else
                       _attr(_NUM_OPS, _int64(work[0])) + _attr(_TENSOR_SIZE, _uint64(work[1])))
        if preds:  # why each data_dep is there: its evidence source, in data_deps order (docs/OUTPUT.md)
            out.append(self._evidence(tuple(e.source.value for e in preds)))
        return b"".join(out), ntype, data_deps

    def _evidence(self, sources: tuple[str, ...]) -> bytes:
        encoded = self.evidence.get(sources)
        if encoded is None:  # few distinct combinations occur: encode each once
            values = b"".join(_len_field(_LIST_VALUES, _text(s)) for s in sources)
            encoded = self.evidence[sources] = _attr(_EVIDENCE, _len_field(b"", values))
        return encoded

    def _kind(self, kind: str) -> bytes:
        encoded = self.kinds.get(kind)
        if encoded is None:
            encoded = self.kinds[kind] = _string_attr(_KIND, kind)
        return encoded

    def _attrs(self, it: Item, out: list[bytes]) -> None:
        """The IOInfo fields and the attrs, in the order the node has them."""
        gpu = on_gpu(it)
        pg_init = it.kind == HOST_OP and it.name == PG_INIT_NAME
        host = it.host
        if host is not None:
            values, shapes, types = _io(host.inputs)
            # ASTRA-sim parses this node's inputs.values as `substr(2, size-4)` JSON whose group names would
            # replace comm_group.json's ids (docs/FACTS.md §A1): leave it empty, keep the host ET's list in an attr.
            out.append(_io_bytes(_N_INPUTS, "" if pg_init else values, shapes, types))
            out.append(_io_bytes(_N_OUTPUTS, *_io(host.outputs)))
            host_attrs = _host_attrs(host, it.measured, values if pg_init else None)
        out.append(self._kind(PG_INIT_KIND if pg_init else it.kind))
        out.append(_IS_CPU_OP[it.comm is None and not gpu])
        if gpu:
            out.append(_attr(_DEVICE, _int64(it.device or 0)) + _attr(_STREAM, _int64(it.stream or 0)))
        elif it.tid is not None:
            out.append(_attr(_TID, _int64(_tid(it.tid))))
        if host is not None:
            out.append(host_attrs)
        if it.kind == HOST_OP and it.measured:
            out.append(_attr(_EXCLUSIVE, _int64(round(it.excl))))
        if it.part_of is not None:
            out.append(_attr(_PART_OF, _int64(it.part_of)))
        if it.orphan_parent is not None:
            out.append(_attr(_ORPHAN_PARENT, _int64(it.orphan_parent)))
        if it.correlation is not None:  # runtime calls
            out.append(_attr(_CORRELATION, _int64(it.correlation)))
        if it.comm is not None:
            out.append(_comm_attrs(it.comm, it.dur))


def _host_attrs(h: OpRecord, linked: bool, pg_config: str | None) -> bytes:
    attrs = [_attr(_ET_TID, _int64(h.et_tid)), _attr(_ET_PARENT, _int64(h.et_parent)),
             _attr(_RF_ID, _int64(h.rf_id)), _attr(_SEQ_ID, _int64(h.seq_id)), _LINKED[linked]]
    if h.op_schema:
        attrs.append(_string_attr(_OP_SCHEMA, h.op_schema))
    if pg_config is not None:
        attrs.append(_string_attr(_PG_CONFIG, pg_config))
    return b"".join(attrs)


def _comm_attrs(c: Comm, dur: float) -> bytes:
    attrs = [_string_attr(_COLLECTIVE_NAME, c.collective_name), _attr(_COMM_TYPE, _int64(c.comm_type)),
             _attr(_COMM_SIZE, _int64(c.size)), _string_attr(_PG_NAME, c.pg_name)]
    if c.seq is not None:
        attrs.append(_attr(_COMM_SEQ, _int64(c.seq)))
    if c.src is not None:
        attrs.append(_attr(_COMM_SRC, _int32(c.src)))
        attrs.append(_attr(_COMM_DST, _int32(c.dst or 0)))
        attrs.append(_attr(_COMM_TAG, _int32(c.tag or 0)))
    attrs.append(_attr(_MEASURED, _int64(max(0, round(dur)))))
    return b"".join(attrs)


def encode_nodes(g: Graph, deps: Dependencies, roofline: Roofline | None = None
                 ) -> Iterator[tuple[bytes, Item, int, tuple[int, ...]]]:
    """Each node in ascending id as (its protobuf bytes, its item, its type, its data_deps), encoded lazily so
    the writer can stream them; GPU COMP nodes take num_ops and tensor_size from `roofline` (zeros without)."""
    encoder = _Encoder(deps, roofline)
    for it in g.items:
        data, ntype, data_deps = encoder.node(it)
        yield data, it, ntype, data_deps


def build_nodes(g: Graph, deps: Dependencies, roofline: Roofline | None = None) -> Iterator[pb.Node]:
    """The nodes of `encode_nodes` as protobuf objects."""
    for data, _, _, _ in encode_nodes(g, deps, roofline):
        yield pb.Node.FromString(data)
