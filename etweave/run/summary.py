"""What the cross-rank work reads and may change of one rank's converted `.et` stream, found once, where the rank
is converted (a worker of the pool or of a Dask cluster), so the parent never parses a whole rank again.

The cross-rank work changes few nodes of a rank: its comm nodes (run-wide pg names, transfer durations), the later
periods of its collectives (`part_of`), and, when the rank started after the run's first instant, its sources and
thread roots (they wait for a new `[rank start offset]` node). A `RankSummary` names those nodes and where each one's
bytes lie in the stream; the parent parses only them, and writes the rank's final stream as the converted one with
the changed nodes' bytes put in place and the offset node appended (`splice`). Every other node keeps the bytes the
converter wrote, which are the bytes protobuf writes for it (etweave.nodes), so the result is the stream a full
parse, edit and re-serialization would give.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from etweave.chakra import schema
from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.chakra.io import BYTE_VARINTS, attr_value, decode_varint, parse, varint_bytes
from etweave.errors import BadInput
from etweave.model import PROCESS_ROOT
from etweave.nodes import MARKER_KINDS

if TYPE_CHECKING:
    from etweave.chakra import et_def_pb2 as pb

PART_OF = "part_of"  # attr of an op's later periods: the id of its first, the comm node (etweave.nodes)


class RankSummary(msgspec.Struct, frozen=True, gc=False):
    """One rank's stream as the cross-rank work needs it (see the module docstring)."""

    nodes: int  # how many nodes the stream holds
    next_id: int  # one more than its largest node id: the id a start offset node takes
    first_start: int  # its first measured start, µs (0: nothing measured)
    comm: tuple[int, ...]  # ids of its comm nodes, in stream order
    parts: tuple[int, ...]  # ids of the later periods of its collectives (COMP nodes whose part_of is one), in order
    roots: tuple[int, ...]  # ids of its process roots (no predecessor), ascending: what a start offset node follows
    offset_targets: tuple[int, ...]  # ids of the nodes that would wait for a start offset node, in stream order
    spans: dict[int, tuple[int, int]]  # id -> (start, end) in the stream of each node above: length prefix included


def node_spans(data: bytes) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """The metadata's span and every node's, each from its length prefix to its end. BadInput when the stream's
    framing is broken."""
    spans: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    while pos < end:
        try:
            size, start = decode_varint(data, pos)
        except (IndexError, ValueError) as exc:
            raise BadInput("<memory>", f"not a Chakra .et stream: bad length prefix at byte {pos}") from exc
        if start + size > end:
            raise BadInput("<memory>", f"not a Chakra .et stream: truncated message at byte {start}")
        spans.append((pos, start + size))
        pos = start + size
    if not spans:
        raise BadInput("<memory>", "empty stream: no GlobalMetadata")
    return spans[0], spans[1:]


def summary_of(data: bytes) -> RankSummary:
    """The summary of a stream this process converted (its nodes were checked as they were written)."""
    nodes, spans = parsed(data)
    return summarize(data, nodes, spans)


def parsed(data: bytes) -> tuple[list[pb.Node], list[tuple[int, int]]]:
    """The stream's nodes and the span of each (BadInput when it is not a Chakra stream)."""
    _metadata, nodes = parse(data)
    _metadata_span, spans = node_spans(data)
    return nodes, spans


def message(data: bytes, span: tuple[int, int]) -> bytes:
    """The message of a span: its bytes after the length prefix."""
    return data[decode_varint(data, span[0])[1]:span[1]]


def summarize(data: bytes, nodes: Sequence[pb.Node], spans: Sequence[tuple[int, int]]) -> RankSummary:
    """The summary of a stream whose nodes (parsed, in order) lie at `spans` (`node_spans`)."""
    comm = [n for n in nodes if n.type in COMM_NODE_TYPES]
    colls = {n.id for n in comm if n.type == schema.COMM_COLL_NODE}
    parts = []
    if colls and _PART_OF_NAME in data:  # only ops split into periods have them: most streams have none to scan
        parts = [n for n, (start, end) in zip(nodes, spans, strict=True)
                 if n.type == schema.COMP_NODE and data.find(_PART_OF_NAME, start, end) >= 0 and _owner(n) in colls]
    roots, targets = offset_targets(nodes)
    listed = {n.id for n in (*comm, *parts)} | set(targets)
    return RankSummary(
        nodes=len(nodes), next_id=max((n.id for n in nodes), default=0) + 1,
        first_start=min((n.start_time_micros for n in nodes if n.start_time_micros > 0), default=0),
        comm=tuple(n.id for n in comm), parts=tuple(n.id for n in parts), roots=tuple(sorted(roots)),
        offset_targets=tuple(targets),
        spans={n.id: span for n, span in zip(nodes, spans, strict=True) if n.id in listed})


_PART_OF_NAME = bytes([len(PART_OF)]) + PART_OF.encode()  # the attr's name field as written: its length, its bytes


def offset_targets(nodes: Iterable[pb.Node]) -> tuple[set[int], list[int]]:
    """The process roots (no predecessor) and, in node order, the nodes that a rank start offset node delays: the
    rank's sources (nodes whose only predecessors are process roots, or none) and its thread roots (everything on
    a thread follows its root). Roots are zero-duration COMP_NODEs told apart by their `kind` attr
    (METADATA_NODE in older outputs). Cross-rank edits change no node's deps or kind: this holds for the final
    stream as for the converted one."""
    nodes = list(nodes)
    roots = {n.id for n in nodes if not n.data_deps and not n.ctrl_deps and _kind(n) == PROCESS_ROOT}
    targets = []
    for n in nodes:  # (the kind of only the few nodes that follow nothing but roots is read)
        deps = n.data_deps
        if n.id in roots or (deps and (deps[0] not in roots or not set(deps) <= roots)):
            continue
        if n.type == schema.METADATA_NODE or _kind(n) in MARKER_KINDS or not n.ctrl_deps:
            targets.append(n.id)
    return roots, targets
def splice(data: bytes, spans: Mapping[int, tuple[int, int]], changed: Mapping[int, bytes], appended: bytes = b""
           ) -> bytes:
    """The stream `data` with the node of each id in `changed` replaced by those bytes (its length prefix
    rewritten), and one more node's bytes at the end when `appended`."""
    parts: list[bytes] = []
    pos = 0
    for start, end, encoded in sorted((*spans[i], encoded) for i, encoded in changed.items()):
        parts += [data[pos:start], _framed(encoded)]
        pos = end
    parts.append(data[pos:])
    if appended:
        parts.append(_framed(appended))
    return b"".join(parts)


def _framed(encoded: bytes) -> bytes:
    n = len(encoded)
    return (BYTE_VARINTS[n] if n < 0x80 else varint_bytes(n)) + encoded


def _kind(node: pb.Node) -> str | None:
    for a in node.attr:
        if a.name == "kind":
            return a.string_val
    return None


def _owner(node: pb.Node) -> int | None:
    """The node's `part_of` attr: the id of the op's first period (an int attr), else None."""
    for a in node.attr:
        if a.name == PART_OF:
            value = attr_value(a)
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None
