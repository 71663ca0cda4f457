"""Build nodes (after the STAGES): items and their incoming edges into Chakra protobuf nodes (docs/FACTS.md §E)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, cast

import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.deps import Dependencies
from etweave.model import GPU_KINDS, HOST_OP, PROCESS_ROOT, THREAD_ROOT, Comm, Graph, Item, OpRecord
from etweave.read.host_et import IO, PG_INIT_NAME
from etweave.roofline import Roofline

DEP_EVIDENCE = "dep_evidence"


def _attr(name: str, **value: Any) -> pb.AttributeProto:
    return pb.AttributeProto(name=name, **value)


def _io(io: IO) -> pb.IOInfo:
    dumps = orjson.dumps
    return pb.IOInfo(values=dumps(io.values).decode(), shapes=dumps(io.shapes).decode(),
                     types=dumps(io.types).decode())


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
    return max(0, round(it.seg_end) - round(it.start))


def build_nodes(g: Graph, deps: Dependencies, roofline: Roofline | None = None) -> Iterator[pb.Node]:
    """Nodes in ascending id, built lazily so the writer can stream them; GPU COMP nodes take num_ops and
    tensor_size from `roofline` (zeros without)."""
    work = roofline.values if roofline is not None else {}
    for it in g.items:
        preds = deps.preds.get(it.id, ())
        node = pb.Node(
            id=it.id,
            name=it.name,
            type=node_type(it),
            data_deps=[e.src for e in preds],
            start_time_micros=max(0, round(it.start)) if it.measured or it.start > 0 else 0,
            duration_micros=duration(it),
        )
        if it.host is not None:
            node.inputs.CopyFrom(_io(it.host.inputs))
            node.outputs.CopyFrom(_io(it.host.outputs))
            if it.kind == HOST_OP and it.name == PG_INIT_NAME:
                # ASTRA-sim parses this node's inputs.values as `substr(2, size-4)` JSON whose group names would
                # replace comm_group.json's ids (docs/FACTS.md §A1): leave it empty, keep the host ET's list in an attr.
                node.inputs.values = ""
        node.attr.extend(_attrs(it))
        if node.type == pb.COMP_NODE:
            # ASTRA-sim's roofline mode throws on a COMP_NODE without both (docs/FACTS.md §A3); 0 = not known
            num_ops, tensor_size = work.get(it.id, (0, 0))
            node.attr.append(_attr("num_ops", int64_val=num_ops))
            node.attr.append(_attr("tensor_size", uint64_val=tensor_size))
        if preds:  # why each data_dep is there: its evidence source, in data_deps order (docs/OUTPUT.md)
            node.attr.append(_evidence_attr(tuple(e.source.value for e in preds)))
        yield node


@functools.lru_cache(maxsize=4096)
def _evidence_attr(sources: tuple[str, ...]) -> pb.AttributeProto:
    # few distinct combinations occur: build each once (append copies it into the node)
    return _attr(DEP_EVIDENCE, string_list=pb.StringList(values=sources))


def on_gpu(it: Item) -> bool:
    """GPU events, and idle time on a stream: not CPU ops (`is_cpu_op` false)."""
    return it.kind in GPU_KINDS or it.stream is not None


def _attrs(it: Item) -> list[pb.AttributeProto]:
    gpu = on_gpu(it)
    kind = PG_INIT_KIND if it.kind == HOST_OP and it.name == PG_INIT_NAME else it.kind
    attrs = [_attr("kind", string_val=kind), _attr("is_cpu_op", bool_val=it.comm is None and not gpu)]
    if it.tid is not None and not gpu:
        attrs.append(_attr("tid", int64_val=_tid(it.tid)))
    if gpu:
        attrs.append(_attr("device", int64_val=it.device or 0))
        attrs.append(_attr("stream", int64_val=it.stream or 0))
    if it.host is not None:
        attrs.extend(_host_attrs(it.host, it.measured, kind == PG_INIT_KIND))
    if it.kind == HOST_OP and it.measured:
        attrs.append(_attr("exclusive_micros", int64_val=round(it.excl)))
    if it.part_of is not None:
        attrs.append(_attr("part_of", int64_val=it.part_of))
    if it.orphan_parent is not None:
        attrs.append(_attr("orphan_parent", int64_val=it.orphan_parent))
    if it.correlation is not None:  # runtime calls
        attrs.append(_attr("correlation", int64_val=it.correlation))
    if it.comm is not None:
        attrs.extend(_comm_attrs(it.comm, it.dur))
    return attrs


def _host_attrs(h: OpRecord, linked: bool, pg_init: bool) -> list[pb.AttributeProto]:
    attrs = [_attr("et_tid", int64_val=h.et_tid), _attr("et_parent", int64_val=h.et_parent),
             _attr("rf_id", int64_val=h.rf_id), _attr("seq_id", int64_val=h.seq_id), _attr("linked", bool_val=linked)]
    if h.op_schema:
        attrs.append(_attr("op_schema", string_val=h.op_schema))
    if pg_init:
        attrs.append(_attr("pg_config", string_val=_io(h.inputs).values))
    return attrs


def _comm_attrs(c: Comm, dur: float) -> list[pb.AttributeProto]:
    attrs = [_attr("collective_name", string_val=c.collective_name), _attr("comm_type", int64_val=c.comm_type),
             _attr("comm_size", int64_val=c.size), _attr("pg_name", string_val=c.pg_name)]
    if c.seq is not None:
        attrs.append(_attr("comm_seq", int64_val=c.seq))
    if c.src is not None:
        attrs.append(_attr("comm_src", int32_val=c.src))
        attrs.append(_attr("comm_dst", int32_val=c.dst or 0))
        attrs.append(_attr("comm_tag", int32_val=c.tag or 0))
    attrs.append(_attr("measured_duration_micros", int64_val=max(0, round(dur))))
    return attrs
