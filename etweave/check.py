"""Checks that a Chakra trace will load and run in ASTRA-sim (docs/FACTS.md §E and §A; §A wins).

Pure functions over protobuf nodes, so the converter can run them on in-memory nodes before writing and
`etweave check` can run them on files. Everything is linear in nodes + edges (the p2p matching sorts only the
send/recv nodes), and nothing is logged per node: callers get a list of `Violation`s, and warnings (what runs,
but not as measured) in a separate list when they pass one.

Rules, by the name a `Violation` carries:

per file (`check_metadata`)
  metadata-empty        GlobalMetadata has neither a version nor attrs: it encodes to 0 bytes, which readers take
                        as end of file (a message with attrs and no version, as Chakra's converter writes, is fine)

per rank (`check_nodes`)
  duplicate-id          two nodes share an id
  dangling-data-dep     a data_deps entry names no node in the file
  dangling-ctrl-dep     a ctrl_deps entry names no node in the file (ASTRA-sim gates issue on both sets, 3b.6)
  self-edge             a node depends on itself
  cycle                 the union of data_deps and ctrl_deps has a cycle (the simulator would wait forever)
  node-type             METADATA_NODE (ASTRA-sim aborts at tick 0, 3b.1), INVALID_NODE (skipped: its work is
                        lost), or a value outside NodeType
  attr-type             an attr in the wrong oneof (the simulator reads it as 0) or with no value
  is-cpu-op             is_cpu_op true on a comm node (ASTRA-sim throws) or on GPU work
  roofline-attr         a COMP_NODE without num_ops or tensor_size (roofline mode throws, 3b.3)
  comm-missing-attr     a collective without comm_type/comm_size, a send/recv without comm_src/dst/tag/size
  unsupported-collective a comm_type the simulator throws on (or no CollectiveCommType at all)
  pg-id                 a pg_name that is neither "" nor a decimal id >= 1 (CommunicatorGroup asserts id > 0, 3b.5)
  pg-init-values        a `## process_group:init ##` node whose inputs.values, cut as the feeder does
                        (`substr(2, size-4)`), is not a JSON list of {"pg_name": decimal, "ranks": [ints]}; empty is
                        fine (3b.1)

across ranks (`check_run`)
  pg-id                 a comm-group map key that is not a decimal id >= 1
  pg-name               a non-empty pg_name that is not a key of the comm-group map (or no map was given)
  pg-member             a rank uses a group it is not a member of
  coll-mismatch         member ranks of a group issue different numbers of collectives of some type
  p2p-rank              a send whose comm_src, or a recv whose comm_dst, is not the rank of its file (3b.6)
  p2p-match             a send without its recv (or the reverse), or a pair whose sizes differ
  p2p-unchecked         (a note, not a violation) sends/recvs whose peer rank is not among the inputs

Warnings (the file runs, but not as measured), by rule:
  comm-size-zero        a collective the network model times from comm_size alone has comm_size 0: it is free (3b.4)
  mem-node              MEM_LOAD_NODE / MEM_STORE_NODE: timed by ASTRA-sim's remote-memory model from tensor_size
  single-rank           one rank: the analytical network refuses 1 NPU; run it as 2 NPUs (3b.7)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import eq, itemgetter, le, lt
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import orjson

from etweave.chakra import schema
from etweave.chakra.accepts import (
    ATTR_TYPES,
    COLLECTIVE_ATTRS,
    COMM_NODE_TYPES,
    MEM_NODE_TYPES,
    P2P_ATTRS,
    ROOFLINE_ATTRS,
    SIMULATOR_MAPPING,
    SIZE_TIMED_COLLECTIVES,
    SUPPORTED_COLLECTIVES,
    VALID_NODE_TYPES,
    comm_type_name,
    is_group_id,
)
from etweave.matching import group_members, match_p2p
from etweave.model import GPU_KINDS, Item
from etweave.read.host_et import PG_INIT_NAME

if TYPE_CHECKING:
    from etweave.chakra import et_def_pb2 as pb


class Violation(msgspec.Struct, frozen=True):
    rule: str
    where: str  # a file or "rank N"
    message: str
    node: int | None = None  # the node id the message is about, when there is one

    def __str__(self) -> str:
        at = f" node {self.node}" if self.node is not None else ""
        return f"{self.where}{at}: {self.rule}: {self.message}"

    def to_json(self) -> dict[str, object]:
        """As `check --json` and the convert-run report write it."""
        return {"rule": self.rule, "where": self.where, "node": self.node, "message": self.message}


_CYCLE_SHOWN = 8


def _typed_attrs(node: pb.Node, where: str, out: list[Violation] | None, present: set[str] | None = None
                 ) -> dict[str, Any]:
    """The attrs of `node` that have a checked name and the right oneof; wrong ones go to `out` if given. `present`:
    every attr's name is added to it (one pass over the attrs: each is a new wrapper object when read)."""
    values: dict[str, Any] = {}
    add = present.add if present is not None else None
    for attr in node.attr:
        name = attr.name
        if add is not None:
            add(name)
        expected = ATTR_TYPES.get(name)
        if expected is None:
            continue
        kind = attr.WhichOneof("value")
        if kind != expected:
            if out is not None:
                got = kind or "no value"
                out.append(Violation("attr-type", where, f"attr {name} is {got}, must be {expected}", node.id))
            continue
        values[name] = getattr(attr, kind)
    return values


def pg_init_problem(values: str) -> str | None:
    """Why the feeder cannot read a `## process_group:init ##` node's inputs.values, or None when it can (or it
    is empty). Workload::issue_pytorch_pg_metadata cuts `values.substr(2, size-4)` and parses a JSON list of
    {"pg_name": "<int>", "ranks": [ints]}; a value shorter than 2 characters makes substr throw uncaught."""
    if not values:
        return None
    if len(values) < 4:
        return f"inputs.values {values!r} is shorter than the 4 characters the feeder cuts off"
    try:
        groups = orjson.loads(values[2:len(values) - 2])
    except orjson.JSONDecodeError:
        return (f"inputs.values cut as the feeder does ({values[2:42]!r}...) is not JSON; write the JSON list "
                "between two 2-character brackets, or leave it empty")
    if not isinstance(groups, list):
        return "inputs.values cut as the feeder does is not a JSON list"
    for grp in groups:
        if not isinstance(grp, dict) or not isinstance(grp.get("pg_name"), str) or not _is_int_text(grp["pg_name"]) \
                or not isinstance(grp.get("ranks"), list) \
                or not all(isinstance(r, int) and not isinstance(r, bool) for r in grp["ranks"]):
            return f"group {str(grp)[:60]} lacks a decimal string pg_name or an integer list ranks"
    return None


def _is_int_text(text: str) -> bool:
    return text.isascii() and text.lstrip("-").isdecimal()


_TYPE_PROBLEMS = {schema.INVALID_NODE: "INVALID_NODE: ASTRA-sim skips it, so its work is lost",
                  schema.METADATA_NODE: "METADATA_NODE: ASTRA-sim aborts at tick 0 (write COMP_NODE with duration 0)"}


def _check_node_semantics(node: pb.Node, where: str, out: list[Violation],
                          warnings: list[Violation] | None = None) -> None:
    present: set[str] = set()
    attrs = _typed_attrs(node, where, out, present)
    ntype = node.type
    if ntype not in VALID_NODE_TYPES:
        label = _TYPE_PROBLEMS.get(ntype, f"unknown type {ntype}")
        out.append(Violation("node-type", where, f"node type is {label}", node.id))
    elif ntype in MEM_NODE_TYPES and warnings is not None:
        warnings.append(Violation("mem-node", where, f"{schema.node_type_name(ntype)} is timed by ASTRA-sim's "
                                  "remote-memory model from tensor_size, not from duration_micros", node.id))
    if ntype == schema.COMP_NODE and (missing := _absent(present, ROOFLINE_ATTRS)):
        out.append(Violation("roofline-attr", where, f"COMP_NODE lacks {', '.join(missing)}: ASTRA-sim's "
                             "roofline mode throws", node.id))
    if node.name == PG_INIT_NAME:
        problem = pg_init_problem(node.inputs.values)
        if problem is not None:
            out.append(Violation("pg-init-values", where, problem, node.id))
    is_comm = ntype in COMM_NODE_TYPES
    if attrs.get("is_cpu_op") is True and (is_comm or attrs.get("kind") in GPU_KINDS):
        what = "a comm node" if is_comm else f"GPU work ({attrs['kind']})"
        out.append(Violation("is-cpu-op", where, f"is_cpu_op is true on {what}; it must be false", node.id))
    if is_comm:
        _check_comm_node(node, attrs, present, where, out, warnings)


def _absent(present: Container[str], required: Sequence[str]) -> list[str]:
    """The attrs of `required` absent altogether (`present`: the node's attr names); one present in the wrong
    oneof is an attr-type violation."""
    return [name for name in required if name not in present]


def _check_comm_node(node: pb.Node, attrs: Mapping[str, Any], present: Container[str], where: str,
                     out: list[Violation], warnings: list[Violation] | None) -> None:
    ntype = node.type
    group = attrs.get("pg_name", "")
    if group and not is_group_id(group):
        out.append(Violation("pg-id", where, f"pg_name {group!r} is not a decimal group id >= 1 (\"\" = all ranks)",
                             node.id))
    missing = _absent(present, COLLECTIVE_ATTRS if ntype == schema.COMM_COLL_NODE else P2P_ATTRS)
    if missing:
        out.append(Violation("comm-missing-attr", where, f"{schema.node_type_name(ntype)} lacks {', '.join(missing)}",
                             node.id))
    if ntype == schema.COMM_COLL_NODE and "comm_type" in attrs:
        _check_collective_type(node, int(attrs["comm_type"]), attrs.get("comm_size"), where, out, warnings)


def _check_collective_type(node: pb.Node, ctype: int, size: object, where: str, out: list[Violation],
                           warnings: list[Violation] | None) -> None:
    if ctype in SIMULATOR_MAPPING:
        out.append(Violation(
            "unsupported-collective", where,
            f"comm_type {comm_type_name(ctype)} makes the simulator throw; etweave writes it as "
            f"{comm_type_name(SIMULATOR_MAPPING[ctype])}", node.id))
    elif ctype not in SUPPORTED_COLLECTIVES:
        out.append(Violation("unsupported-collective", where,
                             f"comm_type {ctype} is not a CollectiveCommType", node.id))
    elif ctype in SIZE_TIMED_COLLECTIVES and size == 0 and warnings is not None:
        warnings.append(Violation("comm-size-zero", where, f"{comm_type_name(ctype)} with comm_size 0: the "
                                  "network model times it from comm_size alone, so it takes no time", node.id))


def check_metadata(metadata: pb.GlobalMetadata, where: str) -> list[Violation]:
    """Violations in a file's GlobalMetadata. Only an empty message is wrong: with attrs (Chakra's converter
    writes schema, pid, time, ... and no version) it encodes to more than 0 bytes."""
    if metadata.ByteSize() == 0:
        return [Violation("metadata-empty", where, "GlobalMetadata has no version and no attrs: the message "
                          "encodes to 0 bytes, which the feeder reads as end of file, so it would see no nodes")]
    return []


def _find_cycle(nodes: _Shapes, index: dict[int, int], stuck: list[int]) -> list[int]:
    """Indices of one cycle among the nodes Kahn's algorithm could not schedule.

    Every stuck node has a stuck dependency (else its in-degree would have reached 0), so walking from
    stuck node to stuck dependency must revisit a node: the walk from that first repeat is a cycle.
    """
    is_stuck = set(stuck)
    path: list[int] = []
    position: dict[int, int] = {}
    current = stuck[0]
    while current not in position:
        position[current] = len(path)
        path.append(current)
        node = nodes[current]
        for dep in (*node.data_deps, *node.ctrl_deps):
            j = index.get(dep)
            if j is not None and j in is_stuck and dep != node.id:
                current = j
                break
        else:  # cannot happen by the argument above; stop rather than loop
            return path
    return path[position[current]:]


class NodeShape(NamedTuple):
    """What the graph checks need of a node: far smaller than the protobuf node, so a writer can stream nodes
    out and still check the whole graph before the file appears."""

    id: int
    name: str
    data_deps: tuple[int, ...]
    ctrl_deps: tuple[int, ...]


class _Shapes:
    """The `NodeShape`s of a graph's nodes as parallel lists, in node order (no object per node; ctrl_deps, which
    etweave never writes, kept only where present)."""

    __slots__ = ("ctrl_deps", "data_deps", "ids", "items", "names")

    def __init__(self) -> None:
        self.ids: list[int] = []
        # the first nodes' names as items (`NodeChecker.add_encoded`: read only for a message), then the others'
        self.items: Sequence[Item] = ()
        self.names: list[str] = []
        self.data_deps: list[tuple[int, ...]] = []
        self.ctrl_deps: dict[int, tuple[int, ...]] = {}  # position -> the node's ctrl_deps, where it has any

    def add(self, node_id: int, name: str, data_deps: tuple[int, ...], ctrl_deps: tuple[int, ...] = ()) -> None:
        if ctrl_deps:
            self.ctrl_deps[len(self.ids)] = ctrl_deps
        self.ids.append(node_id)
        self.names.append(name)
        self.data_deps.append(data_deps)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> NodeShape:
        return NodeShape(self.ids[i], self.name(i), self.data_deps[i], self.ctrl_deps.get(i, ()))

    def name(self, i: int) -> str:
        """The name of node i."""
        k = i - len(self.items)
        return self.items[i].name if k < 0 else self.names[k]


class NodeChecker:
    """check_nodes, one node at a time: `add` each node (its own attrs and type are checked then), then
    `violations()` adds the checks that need them all (ids, edges, cycles)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.out: list[Violation] = []
        self.warnings: list[Violation] = []  # what runs, but not as measured (module docstring)
        self.shapes = _Shapes()

    def add(self, node: pb.Node) -> None:
        _check_node_semantics(node, self.where, self.out, self.warnings)
        self.add_to_graph(node)

    def add_to_graph(self, node: pb.Node) -> None:
        """A node for the graph checks only (ids, edges, cycles): its own attrs and type were checked before."""
        self.shapes.add(node.id, node.name, tuple(node.data_deps), tuple(node.ctrl_deps))

    def add_encoded(self, items: Sequence[Item], ids: list[int], data_deps: list[tuple[int, ...]],
                    in_full: Iterable[bytes]) -> None:
        """A conversion's nodes as `etweave.nodes.EncodedNodes` encoded them, before any other: `items`, each node's
        item in node order (its name read only for a message), `ids` and `data_deps`, each node's id and data_deps in
        that order, and `in_full`, the bytes of its nodes but plain COMP nodes (comm nodes and `## process_group:init
        ##`), which are decoded and checked in full. A plain COMP node is kept for the graph checks only: the encoder
        writes its attrs in the oneofs of ATTR_TYPES, always with num_ops and tensor_size, and is_cpu_op false on GPU
        work, so the per-node rules hold by construction."""
        shapes = self.shapes
        if shapes.ids:
            raise ValueError("add_encoded takes a conversion's nodes first, before any other")
        for data in in_full:
            _check_node_semantics(_decoded(data), self.where, self.out, self.warnings)
        shapes.ids, shapes.items, shapes.data_deps = ids, items, data_deps

    def violations(self, order: Sequence[Any] | RisingKeys | None = None) -> list[Violation]:
        """The violations found. `order`: a key per node, in the order they were added, that the edges rise in
        (each node's key above its deps'), such as a conversion's order of its items: it shows the graph acyclic
        without a search (`_keys_rise`), also given as `RisingKeys`. Without it, node order is tried (a file in
        topological order)."""
        return self.out + _graph_violations(self.shapes, self.where, order)


def _decoded(data: bytes) -> pb.Node:
    from etweave.chakra import et_def_pb2 as pb  # here: a run of compute nodes only never needs it

    return pb.Node.FromString(data)


def check_nodes(nodes: Sequence[pb.Node], where: str, warnings: list[Violation] | None = None,
                in_full: Container[int] | None = None) -> list[Violation]:
    """Violations within one rank's nodes: ids, edges, cycles, attr types, comm node requirements. Warnings go
    to `warnings` when given. `in_full`: the ids of the nodes whose own attrs and type to check; the others only
    take part in the graph checks (a whole-run conversion's nodes were each checked when their rank was
    converted, and it checks again only those it changed since). None: every node."""
    checker = NodeChecker(where)
    for node in nodes:
        if in_full is None or node.id in in_full:
            checker.add(node)
        else:
            checker.add_to_graph(node)
    if warnings is not None:
        warnings.extend(checker.warnings)
    return checker.violations()


def check_each(nodes: Iterable[pb.Node], where: str, warnings: list[Violation] | None = None) -> list[Violation]:
    """`check_nodes`' rules of one node (its attrs, its type, a comm node's requirements) on each of these, without
    the graph checks: for nodes changed in a graph that was checked whole before (a whole run's cross-rank edits,
    which add no edge that could dangle or close a cycle: etweave.run.summary)."""
    out: list[Violation] = []
    for node in nodes:
        _check_node_semantics(node, where, out, warnings)
    return out


class RisingKeys(NamedTuple):
    """A key per node given in two parts (no tuple per node held): `first`, each node's first component (finite
    numbers), and `whole`, a node's whole key by its id, built only for the edges whose ends tie in `first` (a
    conversion's (start, pos, id): 3% of its edges join two nodes of one start)."""

    first: Sequence[Any]
    whole: Callable[[int], Any]


def _graph_violations(nodes: _Shapes, where: str, order: Sequence[Any] | RisingKeys | None = None
                      ) -> list[Violation]:
    ids = nodes.ids
    n = len(ids)
    positions = None
    if order is None:  # node order (the positions as keys): a file written in topological order
        positions = _first_positions(ids)
        key_of: dict[int, Any] = positions
        keys: Sequence[Any] = range(n)
    elif isinstance(order, RisingKeys):
        first_of = _first_parts(ids, order.first)
        if first_of is not None and _keys_rise_in_two(nodes, first_of, order):
            return []
        key_of, keys = {}, ()  # (not risen: the search below)
    else:
        key_of, keys = dict(zip(ids, order, strict=True)), order
    if keys and len(key_of) == n and _keys_rise(nodes, key_of, keys):
        return []
    index = positions if positions is not None else _first_positions(ids)
    out: list[Violation] = []
    if len(index) < n:
        for i, nid in enumerate(ids):
            first = index[nid]
            if first != i:
                out.append(Violation("duplicate-id", where, f"id also used by an earlier node "
                                     f"({nodes.name(first)!r}, now {nodes.name(i)!r})", nid))
    dependents, indegree = _edges(nodes, index, where, out)
    stuck = _unschedulable(dependents, indegree)
    if stuck:
        out.append(_cycle_violation(nodes, index, stuck, where))
    return out


def _first_parts(ids: list[int], first: Sequence[Any]) -> list[Any] | dict[int, Any] | None:
    """id -> first part: a list indexed by id (None where no node has the id) where the ids rise (so none repeats)
    from 0 or more and are dense (a conversion's: the list holds a fifth of what a dict would, 2 MB where the dict
    took 10 at the self-check's peak on a trace of 224k nodes), else a dict; None: two nodes share an id."""
    n = len(ids)
    if n and ids[0] >= 0 and ids[-1] < 4 * n + 1024:
        by_id: list[Any] = [None] * (ids[-1] + 1)
        last = -1
        # (a loop: the interpreter's list stores are cheaper than a setitem call each in C, and the rise is told
        # in the same pass; half the dict's building on this host)
        try:
            for i, part in zip(ids, first, strict=True):
                if i <= last:  # (before the store: no id below 0 is stored)
                    break
                by_id[i] = part
                last = i
            else:
                return by_id
        except IndexError:  # an id above the last one: they do not rise
            pass
    key_of = dict(zip(ids, first, strict=True))
    return key_of if len(key_of) == n else None


def _first_positions(ids: list[int]) -> dict[int, int]:
    """id -> position of the first node with it (of equal keys, the last one zip gives stays: the first node's)."""
    return dict(zip(reversed(ids), range(len(ids) - 1, -1, -1), strict=True))


def _keys_rise(nodes: _Shapes, key_of: dict[int, Any], keys: Sequence[Any]) -> bool:
    """Whether every dep is the id of a node and every node's key is above its deps' keys (`key_of`: id -> key,
    the ids unique), shown in whole-list passes, no Python step per node or edge. Then the graph has no dangling
    or self edge, and no cycle: keys rise along every path, so none comes back. False: maybe not; the caller
    looks edge by edge. Keys must be totally ordered (numbers, or tuples of them; no NaN)."""
    if nodes.ctrl_deps:  # etweave writes none; files that have them take the long way
        return False
    data_deps = nodes.data_deps
    counts = list(map(len, data_deps))
    one = list(map(eq, counts, repeat(1)))  # most nodes: their one dep's key, no max to take
    many = list(map(lt, repeat(1), counts))
    key = key_of.__getitem__
    try:
        return (all(map(lt, map(key, map(itemgetter(0), compress(data_deps, one))), compress(keys, one)))
                and all(map(lt, map(max, map(map, repeat(key), compress(data_deps, many))), compress(keys, many))))
    except KeyError:  # a dangling dep
        return False


def _keys_rise_in_two(nodes: _Shapes, first_of: list[Any] | dict[int, Any], keys: RisingKeys) -> bool:
    """`_keys_rise` of the keys `keys` gives in two parts (`first_of`: id -> first part, the ids unique; a list None
    where no node has the id): every edge rises or ties in the first part, shown in whole-list passes over each
    node's first part and its latest dep's, and the edges of each node whose two tie rise in the whole key. (The
    deps' own first parts, not their gaps: no number made per node.)"""
    if nodes.ctrl_deps:
        return False
    data_deps, first, n = nodes.data_deps, keys.first, len(nodes)
    counts = list(map(len, data_deps))
    one = list(map(eq, counts, repeat(1)))
    # the nodes of more deps by position (a tenth of a conversion's): their passes go over them alone
    many = list(compress(range(n), map(lt, repeat(1), counts)))
    del counts
    key = first_of.__getitem__
    # a dep that names no node: a KeyError, or in a list an IndexError or None (a TypeError where it is compared);
    # deps are uint64 (the encoder refuses a negative one), so no negative index reaches into the list from its end
    try:  # the one dep's first part, or the latest dep's
        dep_one = list(map(key, map(itemgetter(0), compress(data_deps, one))))
        dep_many = list(map(max, map(map, repeat(key), map(data_deps.__getitem__, many))))
        own_many = list(map(first.__getitem__, many))
        if not (all(map(le, dep_one, compress(first, one))) and all(map(le, dep_many, own_many))):
            return False
    except (KeyError, IndexError, TypeError):
        return False
    tied = [*compress(compress(range(n), one), map(eq, dep_one, compress(first, one))),
            *compress(many, map(eq, dep_many, own_many))]
    whole, ids = keys.whole, nodes.ids
    return all(whole(d) < whole(ids[k]) for k in tied for d in data_deps[k])


def _edges(nodes: _Shapes, index: dict[int, int], where: str, out: list[Violation]
           ) -> tuple[list[list[int]], list[int]]:
    """The graph over positions, not ids, so duplicate ids cannot merge nodes: each node's dependents and
    in-degree. Self-edges and dangling ones are reported and left out, so the cycle check reports only real
    cycles."""
    n = len(nodes)
    indegree = [0] * n
    dependents: list[list[int]] = [[] for _ in range(n)]
    get = index.get
    ctrl = nodes.ctrl_deps
    for i, (nid, data_deps) in enumerate(zip(nodes.ids, nodes.data_deps, strict=True)):
        for label, deps in (("data_dep", data_deps), ("ctrl_dep", ctrl.get(i, ()) if ctrl else ())):
            for dep in deps:
                j = get(dep)
                if j is None or dep == nid:
                    _bad_edge(dep, nid, label, where, out)
                    continue
                dependents[j].append(i)
                indegree[i] += 1
    return dependents, indegree


def _bad_edge(dep: int, nid: int, label: str, where: str, out: list[Violation]) -> None:
    """A self-edge, or a dependency on no node of the trace."""
    if dep == nid:
        out.append(Violation("self-edge", where, f"the node lists itself in its {label}s", nid))
    else:
        out.append(Violation(f"dangling-{label.replace('_', '-')}", where,
                             f"{label} {dep} is not a node in this trace", nid))


def _unschedulable(dependents: list[list[int]], indegree: list[int]) -> list[int]:
    """Kahn's algorithm, iterative: the positions never freed (on or behind a cycle). `indegree` is consumed."""
    ready = [i for i in range(len(indegree)) if indegree[i] == 0]
    while ready:
        i = ready.pop()
        for k in dependents[i]:
            indegree[k] -= 1
            if indegree[k] == 0:
                ready.append(k)
    return [i for i in range(len(indegree)) if indegree[i] > 0]


def _cycle_violation(nodes: _Shapes, index: dict[int, int], stuck: list[int], where: str) -> Violation:
    cycle = _find_cycle(nodes, index, stuck)
    # The walk goes node -> dependency; reverse it so the arrows read in execution order, and start at the
    # smallest id so the report is the same whichever node the walk began from.
    ids = [nodes[i].id for i in reversed(cycle)]
    start = ids.index(min(ids))
    ids = ids[start:] + ids[:start]
    shown = " -> ".join(str(x) for x in ids[:_CYCLE_SHOWN])
    more = f" -> ... ({len(ids)} nodes)" if len(ids) > _CYCLE_SHOWN else f" -> {ids[0]}"
    return Violation("cycle", where, f"dependency cycle {shown}{more}; {len(stuck)} nodes can never run", ids[0])


class EncodedNodes(Mapping[int, list["pb.Node"]]):
    """rank -> its nodes, held encoded and parsed when looked up: `check_run` reads one rank at a time, so a run's
    comm nodes wait as bytes (a parsed node takes about 2 KB, 6 times its bytes: 16 MB for a thousand ranks')."""

    def __init__(self, encoded: Mapping[int, Sequence[bytes]]) -> None:
        self._encoded = encoded

    def __getitem__(self, rank: int) -> list[pb.Node]:
        from etweave.chakra import et_def_pb2 as pb

        return [pb.Node.FromString(data) for data in self._encoded[rank]]

    def __iter__(self) -> Iterator[int]:
        return iter(self._encoded)

    def __len__(self) -> int:
        return len(self._encoded)


def check_run(ranks: Mapping[int, Sequence[pb.Node]], comm_group: Mapping[str, Sequence[int]] | None,
              notes: list[Violation] | None = None, warnings: list[Violation] | None = None) -> list[Violation]:
    """Violations across the ranks of one run: process groups, collective counts, send/recv pairing.

    `ranks` maps global rank to its nodes (only the ranks at hand); `comm_group` is the comm_group.json map.
    A send or recv whose peer rank is not in `ranks` cannot be checked: it goes to `notes` (when given) as a
    Violation-shaped note, never into the returned list, so `if check_run(...)` means "broken".
    Run `check_nodes` per rank as well; this function does not repeat those checks. A single rank is a warning
    (to `warnings` when given).
    """
    out: list[Violation] = []
    present = set(ranks)
    for key in comm_group or {}:
        if not is_group_id(key):
            out.append(Violation("pg-id", "comm group map", f"group id {key!r} is not a decimal id >= 1 "
                                 "(ASTRA-sim's CommunicatorGroup asserts id > 0)"))
    if len(present) == 1 and warnings is not None:
        warnings.append(Violation("single-rank", f"rank {min(present)}", "one rank: ASTRA-sim's analytical "
                                  "network refuses 1 NPU; run it as 2 NPUs (docs/FACTS.md §A7)"))
    comm = _RunComm()
    for rank in sorted(ranks):
        group_uses = _scan_rank(rank, ranks[rank], comm, out)
        _check_group_uses(rank, group_uses, comm_group, out)
    _check_collective_counts(comm.collectives, present, comm_group, out)
    _match_p2p(comm.sends, comm.recvs, present, out, notes)
    return out


class _RunComm(msgspec.Struct):
    """The comm nodes of a run, as the cross-rank checks match them."""

    # (src, dst, tag) -> [(node id, size, file rank)], one list for sends and one for recvs
    sends: dict[tuple[int, int, int], list[tuple[int, int, int]]] = msgspec.field(default_factory=dict)
    recvs: dict[tuple[int, int, int], list[tuple[int, int, int]]] = msgspec.field(default_factory=dict)
    # group -> rank -> Counter of comm_type
    collectives: dict[str, dict[int, Counter[int]]] = msgspec.field(default_factory=dict)


def _scan_rank(rank: int, nodes: Sequence[pb.Node], comm: _RunComm, out: list[Violation]) -> dict[str, list[int]]:
    """One rank's comm nodes into `comm` (a send or recv not of this rank is a p2p-rank violation); returns
    group -> ids of the nodes using it (reported once per group)."""
    where = f"rank {rank}"
    group_uses: dict[str, list[int]] = {}
    for node in nodes:
        ntype = node.type
        if ntype not in COMM_NODE_TYPES:
            continue
        attrs = _typed_attrs(node, where, None)
        group = attrs.get("pg_name", "")
        assert isinstance(group, str)
        if group:
            group_uses.setdefault(group, []).append(node.id)
        if ntype == schema.COMM_COLL_NODE:
            if "comm_type" in attrs:
                per_rank = comm.collectives.setdefault(group, {})
                per_rank.setdefault(rank, Counter())[int(attrs["comm_type"])] += 1
        elif all(name in attrs for name in P2P_ATTRS):  # else check_nodes reports it; it cannot be matched
            _add_p2p(node, attrs, rank, comm, out)
    return group_uses


def _add_p2p(node: pb.Node, attrs: Mapping[str, Any], rank: int, comm: _RunComm, out: list[Violation]) -> None:
    src, dst = int(attrs["comm_src"]), int(attrs["comm_dst"])
    tag, size = int(attrs["comm_tag"]), int(attrs["comm_size"])
    is_send = node.type == schema.COMM_SEND_NODE
    own = src if is_send else dst
    if own != rank:
        field_name = "comm_src" if is_send else "comm_dst"
        kind = "send" if is_send else "recv"
        out.append(Violation("p2p-rank", f"rank {rank}",
                             f"{kind} has {field_name} {own}, but its file is rank {rank}", node.id))
    (comm.sends if is_send else comm.recvs).setdefault((src, dst, tag), []).append((node.id, size, rank))


def _check_group_uses(rank: int, group_uses: Mapping[str, list[int]], comm_group: Mapping[str, Sequence[int]] | None,
                      out: list[Violation]) -> None:
    """Every group a rank uses is in the comm-group map, with the rank among its members."""
    where = f"rank {rank}"
    for group, ids in group_uses.items():
        count = f"{len(ids)} comm node(s), first {ids[0]}"
        if comm_group is None:
            out.append(Violation("pg-name", where, f"pg_name {group!r} used by {count}, but no comm-group "
                                 "map was given (comm_group.json)"))
        elif group not in comm_group:
            out.append(Violation("pg-name", where, f"pg_name {group!r} used by {count} is not in the "
                                 f"comm-group map (groups: {', '.join(sorted(comm_group)) or 'none'})"))
        elif rank not in comm_group[group]:
            out.append(Violation("pg-member", where, f"pg_name {group!r} used by {count}, but rank {rank} "
                                 f"is not among its ranks {list(comm_group[group])}"))


def _check_collective_counts(collectives: dict[str, dict[int, Counter[int]]], present: set[int],
                             comm_group: Mapping[str, Sequence[int]] | None, out: list[Violation]) -> None:
    # Counts per type, not order: issue order depends on the dependency graph, but a rank that issues fewer
    # collectives in a group leaves its peers waiting forever whatever the order.
    for group in sorted(collectives):
        members = group_members(group, present, comm_group)
        if not members:
            continue  # an unknown group (None) is a pg-name violation already; its members are unknown
        per_rank = collectives[group]
        reference = members[0]
        expected = per_rank.get(reference, Counter())
        for rank in members[1:]:
            got = per_rank.get(rank, Counter())
            if got != expected:
                out.append(Violation(
                    "coll-mismatch", f"rank {rank}",
                    f"group {group or '(all ranks)'}: issues {_describe(got)}, but rank {reference} issues "
                    f"{_describe(expected)}; every rank of a group must issue the same collectives"))


def _describe(counts: Counter[int]) -> str:
    if not counts:
        return "no collectives"
    return ", ".join(f"{n} {comm_type_name(t)}" for t, n in sorted(counts.items()))


def _match_p2p(sends: dict[tuple[int, int, int], list[tuple[int, int, int]]],
               recvs: dict[tuple[int, int, int], list[tuple[int, int, int]]], present: set[int],
               out: list[Violation], notes: list[Violation] | None) -> None:
    # etweave.matching's rule: the n-th send on a (src, dst, tag) channel pairs with the n-th recv on it.
    for match in match_p2p(sends, recvs, present):
        src, dst, tag = match.channel
        if not match.matchable:
            missing = dst if dst not in present else src
            if notes is not None:
                count = len(match.sends) + len(match.recvs)
                notes.append(Violation("p2p-unchecked", f"rank {src if missing == dst else dst}",
                                       f"{count} send/recv(s) {src} -> {dst} tag {tag}: rank {missing} is not "
                                       "among the inputs, so they were not matched"))
            continue
        for (send_id, send_size, send_rank), (recv_id, recv_size, recv_rank) in match.pairs:
            if send_size != recv_size:
                out.append(Violation("p2p-match", f"rank {send_rank}",
                                     f"send {src} -> {dst} tag {tag} is {send_size} bytes, but its recv "
                                     f"(node {recv_id} on rank {recv_rank}) is {recv_size} bytes", send_id))
        for node_id, size, rank in match.unmatched_sends:
            out.append(Violation("p2p-match", f"rank {rank}",
                                 f"send {src} -> {dst} tag {tag} ({size} bytes) has no matching recv on rank {dst}",
                                 node_id))
        for node_id, size, rank in match.unmatched_recvs:
            out.append(Violation("p2p-match", f"rank {rank}",
                                 f"recv {src} -> {dst} tag {tag} ({size} bytes) has no matching send on rank {src}",
                                 node_id))
