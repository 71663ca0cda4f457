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

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, cast

import msgspec

from etweave.chakra import schema
from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.chakra.io import BYTE_VARINTS, attr_value, decode_varint, parse, varint_bytes
from etweave.chakra.reduced import node_class
from etweave.errors import BadInput
from etweave.model import PROCESS_ROOT
from etweave.nodes import MARKER_KINDS

if TYPE_CHECKING:
    from etweave.chakra import et_def_pb2 as pb

# what the summary reads of every node; the attrs only of the few whose kind or part_of it needs
_Skeleton = node_class("Skeleton", ("id", "type", "ctrl_deps", "data_deps", "start_time_micros"))
_Attrs = node_class("Attrs", ("attr",))  # what `_kind` and `_owner` read
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
    spans, _messages = _framing(data)
    return spans[0], spans[1:]


def _framing(data: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Of the metadata and every node: its span (`node_spans`) and where its message's bytes lie."""
    spans: list[tuple[int, int]] = []
    messages: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    while pos < end:
        try:  # most prefixes are one or two bytes
            size = data[pos]
            if size < 0x80:
                start = pos + 1
            elif pos + 1 < end and (high := data[pos + 1]) < 0x80:
                size, start = (size & 0x7F) | high << 7, pos + 2
            else:
                size, start = decode_varint(data, pos)
        except (IndexError, ValueError) as exc:
            raise BadInput("<memory>", f"not a Chakra .et stream: bad length prefix at byte {pos}") from exc
        if start + size > end:
            raise BadInput("<memory>", f"not a Chakra .et stream: truncated message at byte {start}")
        spans.append((pos, start + size))
        messages.append((start, start + size))
        pos = start + size
    if not spans:
        raise BadInput("<memory>", "empty stream: no GlobalMetadata")
    return spans, messages


def summary_of(data: bytes) -> RankSummary:
    """The summary of a stream this process converted (its nodes were checked as they were written). Each node is
    parsed with the fields the summary reads only (`_Skeleton`), the attrs of the few whose kind or part_of it reads
    on their own (`_Attrs`): a quarter fewer instructions than parsing every node whole."""
    spans, messages = _framing(data)
    del spans[0], messages[0]  # the metadata's
    skeleton = _Skeleton.FromString
    skeletons = cast(list[NodeShape], [skeleton(data[start:end]) for start, end in messages])

    def with_attrs(i: int) -> pb.Node:  # (a Node of its attrs alone: all `_kind` and `_owner` read)
        start, end = messages[i]
        return cast("pb.Node", _Attrs.FromString(data[start:end]))

    return summarize(data, skeletons, spans, with_attrs)


def parsed(data: bytes) -> tuple[list[pb.Node], list[tuple[int, int]]]:
    """The stream's nodes and the span of each (BadInput when it is not a Chakra stream)."""
    _metadata, nodes = parse(data)
    _metadata_span, spans = node_spans(data)
    return nodes, spans


def message(data: bytes, span: tuple[int, int]) -> bytes:
    """The message of a span: its bytes after the length prefix."""
    return data[decode_varint(data, span[0])[1]:span[1]]


class NodeShape(Protocol):
    """What the summary reads of every node (a `pb.Node`, or the `_Skeleton` of one)."""

    @property
    def id(self) -> int: ...
    @property
    def type(self) -> int: ...
    @property
    def data_deps(self) -> Sequence[int]: ...
    @property
    def ctrl_deps(self) -> Sequence[int]: ...
    @property
    def start_time_micros(self) -> int: ...


def summarize(data: bytes, nodes: Sequence[NodeShape], spans: Sequence[tuple[int, int]],
              with_attrs: Callable[[int], pb.Node] | None = None) -> RankSummary:
    """The summary of a stream whose nodes (parsed, in order) lie at `spans` (`node_spans`). `with_attrs(i)`: the
    node at position i with its attrs, for the few whose attrs are read (default: `nodes[i]`, parsed whole)."""
    whole = with_attrs if with_attrs is not None else cast(Callable[[int], "pb.Node"], nodes.__getitem__)
    comm = [n for n in nodes if n.type in COMM_NODE_TYPES]
    colls = {n.id for n in comm if n.type == schema.COMM_COLL_NODE}
    parts = []
    if colls and _PART_OF_NAME in data:  # only ops split into periods have them: most streams have none to scan
        parts = [n for i, (n, (start, end)) in enumerate(zip(nodes, spans, strict=True))
                 if n.type == schema.COMP_NODE and data.find(_PART_OF_NAME, start, end) >= 0
                 and _owner(whole(i)) in colls]
    roots, targets = offset_targets(nodes, lambda i: _kind(whole(i)))
    listed = {n.id for n in (*comm, *parts)} | set(targets)
    return RankSummary(
        nodes=len(nodes), next_id=max((n.id for n in nodes), default=0) + 1,
        first_start=min((n.start_time_micros for n in nodes if n.start_time_micros > 0), default=0),
        comm=tuple(n.id for n in comm), parts=tuple(n.id for n in parts), roots=tuple(sorted(roots)),
        offset_targets=tuple(targets),
        spans={n.id: span for n, span in zip(nodes, spans, strict=True) if n.id in listed})


_PART_OF_NAME = bytes([len(PART_OF)]) + PART_OF.encode()  # the attr's name field as written: its length, its bytes


def offset_targets(nodes: Sequence[NodeShape], kind_at: Callable[[int], str | None] | None = None
                   ) -> tuple[set[int], list[int]]:
    """The process roots (no predecessor) and, in node order, the nodes that a rank start offset node delays: the
    rank's sources (nodes whose only predecessors are process roots, or none) and its thread roots (everything on
    a thread follows its root). Roots are zero-duration COMP_NODEs told apart by their `kind` attr
    (METADATA_NODE in older outputs). Cross-rank edits change no node's deps or kind: this holds for the final
    stream as for the converted one. `kind_at(i)`: the kind of the node at position i (default: read from
    `nodes[i]`, a whole `pb.Node`)."""
    kind = kind_at if kind_at is not None else (lambda i: _kind(cast("pb.Node", nodes[i])))
    roots = {n.id for i, n in enumerate(nodes) if not n.data_deps and not n.ctrl_deps and kind(i) == PROCESS_ROOT}
    targets = []
    for i, n in enumerate(nodes):  # (the kind of only the few nodes that follow nothing but roots is read)
        deps = n.data_deps
        if n.id in roots or (deps and (deps[0] not in roots or not set(deps) <= roots)):
            continue
        if n.type == schema.METADATA_NODE or kind(i) in MARKER_KINDS or not n.ctrl_deps:
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
