"""Checks that a Chakra trace will load and run in ASTRA-sim (FORMATS.md sections 3 and 3b; 3b wins).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.matching import group_members, match_p2p
from etweave.read.host_et import PG_INIT_NAME


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    where: str  # a file or "rank N"
    message: str
    node: int | None = None  # the node id the message is about, when there is one

    def __str__(self) -> str:
        at = f" node {self.node}" if self.node is not None else ""
        return f"{self.where}{at}: {self.rule}: {self.message}"


# The oneof each attr must use. FORMATS.md section 3 item 3 (what the simulator reads) plus the attrs OUTPUT.md
# documents for etweave's own output, so a converter that drifts from its own documentation is caught too.
ATTR_TYPES: dict[str, str] = {
    # read by ASTRA-sim / its feeder
    "is_cpu_op": "bool_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "num_ops": "int64_val",
    "pg_name": "string_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "comm_priority": "int32_val",
    "involved_dim": "bool_list",
    "tensor_size": "uint64_val",
    "pg_config": "string_val",
    # etweave's replay resources (OUTPUT.md)
    "tid": "int64_val",
    "device": "int64_val",
    "stream": "int64_val",
    # etweave's provenance attrs (OUTPUT.md)
    "kind": "string_val",
    "et_tid": "int64_val",
    "et_parent": "int64_val",
    "orphan_parent": "int64_val",
    "linked": "bool_val",
    "rf_id": "int64_val",
    "seq_id": "int64_val",
    "collective_name": "string_val",
    "comm_seq": "int64_val",
}

COMM_NODE_TYPES = frozenset({pb.COMM_SEND_NODE, pb.COMM_RECV_NODE, pb.COMM_COLL_NODE})
# Types ASTRA-sim issues (3b.1: METADATA_NODE aborts it; INVALID_NODE is skipped, so its work would be lost)
VALID_NODE_TYPES = frozenset({pb.COMP_NODE, pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE, *COMM_NODE_TYPES})
MEM_NODE_TYPES = frozenset({pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE})
# Collectives the network model times from comm_size alone (BROADCAST replays duration_micros), 3b.4
SIZE_TIMED_COLLECTIVES = frozenset({pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL})
ROOFLINE_ATTRS = ("num_ops", "tensor_size")
GPU_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

# Collectives the simulator runs (BROADCAST is replayed from duration_micros), and what etweave writes instead
# of each one it throws on. The converter should import this mapping so the two never disagree.
SUPPORTED_COLLECTIVES = frozenset({pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL, pb.BROADCAST})
SIMULATOR_MAPPING: dict[int, int] = {
    pb.BARRIER: pb.ALL_REDUCE,  # a barrier behaves like a tiny all-reduce: everyone waits for everyone
    pb.REDUCE: pb.ALL_REDUCE,  # same traffic to the root, plus the result fanned back out
    pb.GATHER: pb.ALL_GATHER,  # same per-rank input; every rank receives instead of only the root
    pb.SCATTER: pb.BROADCAST,  # one root fans out; BROADCAST replays the measured duration, so time stays faithful
    pb.REDUCE_SCATTER_BLOCK: pb.REDUCE_SCATTER,  # same operation with equal blocks
}

_COLL_REQUIRED = ("comm_type", "comm_size")
_P2P_REQUIRED = ("comm_src", "comm_dst", "comm_tag", "comm_size")
_CYCLE_SHOWN = 8


def comm_type_name(value: int) -> str:
    try:
        return pb.CollectiveCommType.Name(value)
    except ValueError:
        return str(value)


def _typed_attrs(node: pb.Node, where: str, out: list[Violation] | None) -> dict[str, Any]:
    """The attrs of `node` that have a checked name and the right oneof; wrong ones go to `out` if given."""
    values: dict[str, Any] = {}
    for attr in node.attr:
        name = attr.name
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


def is_group_id(name: str) -> bool:
    """A comm-group id ASTRA-sim accepts: decimal digits, value >= 1 (CommunicatorGroup asserts id > 0)."""
    return name.isascii() and name.isdecimal() and int(name) >= 1


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


def _check_node_semantics(node: pb.Node, where: str, out: list[Violation],
                          warnings: list[Violation] | None = None) -> None:
    attrs = _typed_attrs(node, where, out)
    ntype = node.type
    if ntype not in VALID_NODE_TYPES:
        label = {pb.INVALID_NODE: "INVALID_NODE: ASTRA-sim skips it, so its work is lost",
                 pb.METADATA_NODE: "METADATA_NODE: ASTRA-sim aborts at tick 0 (write COMP_NODE with duration 0)"
                 }.get(ntype, f"unknown type {ntype}")
        out.append(Violation("node-type", where, f"node type is {label}", node.id))
    elif ntype in MEM_NODE_TYPES and warnings is not None:
        warnings.append(Violation("mem-node", where, f"{pb.NodeType.Name(ntype)} is timed by ASTRA-sim's "
                                  "remote-memory model from tensor_size, not from duration_micros", node.id))
    if ntype == pb.COMP_NODE:
        present = {a.name for a in node.attr}
        missing = [name for name in ROOFLINE_ATTRS if name not in present]
        if missing:
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
    if not is_comm:
        return
    group = attrs.get("pg_name", "")
    if group and not is_group_id(group):
        out.append(Violation("pg-id", where, f"pg_name {group!r} is not a decimal group id >= 1 (\"\" = all ranks)",
                             node.id))
    # "Missing" means absent altogether; an attr present in the wrong oneof is already an attr-type violation.
    present = {a.name for a in node.attr}
    required = _COLL_REQUIRED if ntype == pb.COMM_COLL_NODE else _P2P_REQUIRED
    missing = [name for name in required if name not in present]
    if missing:
        kind = pb.NodeType.Name(ntype)
        out.append(Violation("comm-missing-attr", where, f"{kind} lacks {', '.join(missing)}", node.id))
    if ntype == pb.COMM_COLL_NODE and "comm_type" in attrs:
        ctype = int(attrs["comm_type"])
        if ctype in SIMULATOR_MAPPING:
            out.append(Violation(
                "unsupported-collective", where,
                f"comm_type {comm_type_name(ctype)} makes the simulator throw; etweave writes it as "
                f"{comm_type_name(SIMULATOR_MAPPING[ctype])}", node.id))
        elif ctype not in SUPPORTED_COLLECTIVES:
            out.append(Violation("unsupported-collective", where,
                                 f"comm_type {ctype} is not a CollectiveCommType", node.id))
        elif ctype in SIZE_TIMED_COLLECTIVES and attrs.get("comm_size") == 0 and warnings is not None:
            warnings.append(Violation("comm-size-zero", where, f"{comm_type_name(ctype)} with comm_size 0: the "
                                      "network model times it from comm_size alone, so it takes no time", node.id))


def check_metadata(metadata: pb.GlobalMetadata, where: str) -> list[Violation]:
    """Violations in a file's GlobalMetadata. Only an empty message is wrong: with attrs (Chakra's converter
    writes schema, pid, time, ... and no version) it encodes to more than 0 bytes."""
    if metadata.ByteSize() == 0:
        return [Violation("metadata-empty", where, "GlobalMetadata has no version and no attrs: the message "
                          "encodes to 0 bytes, which the feeder reads as end of file, so it would see no nodes")]
    return []


def _find_cycle(nodes: Sequence[NodeShape], index: dict[int, int], stuck: list[int]) -> list[int]:
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


@dataclass(frozen=True, slots=True)
class NodeShape:
    """What the graph checks need of a node: far smaller than the protobuf node, so a writer can stream nodes
    out and still check the whole graph before the file appears."""

    id: int
    name: str
    data_deps: tuple[int, ...]
    ctrl_deps: tuple[int, ...]


class NodeChecker:
    """check_nodes, one node at a time: `add` each node (its own attrs and type are checked then), then
    `violations()` adds the checks that need them all (ids, edges, cycles)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.out: list[Violation] = []
        self.warnings: list[Violation] = []  # what runs, but not as measured (module docstring)
        self.shapes: list[NodeShape] = []

    def add(self, node: pb.Node) -> None:
        _check_node_semantics(node, self.where, self.out, self.warnings)
        self.shapes.append(NodeShape(node.id, node.name, tuple(node.data_deps), tuple(node.ctrl_deps)))

    def violations(self) -> list[Violation]:
        return self.out + _graph_violations(self.shapes, self.where)


def check_nodes(nodes: Sequence[pb.Node], where: str, warnings: list[Violation] | None = None) -> list[Violation]:
    """Violations within one rank's nodes: ids, edges, cycles, attr types, comm node requirements. Warnings go
    to `warnings` when given."""
    checker = NodeChecker(where)
    for node in nodes:
        checker.add(node)
    if warnings is not None:
        warnings.extend(checker.warnings)
    return checker.violations()


def _graph_violations(nodes: Sequence[NodeShape], where: str) -> list[Violation]:
    out: list[Violation] = []
    index: dict[int, int] = {}  # id -> position of the first node with it
    for i, node in enumerate(nodes):
        first = index.setdefault(node.id, i)
        if first != i:
            out.append(Violation("duplicate-id", where,
                                 f"id also used by an earlier node ({nodes[first].name!r}, now {node.name!r})",
                                 node.id))

    # Graph over positions, not ids, so duplicate ids cannot merge nodes. Self-edges and dangling ones are
    # reported and left out, so the cycle check reports only real cycles.
    n = len(nodes)
    indegree = [0] * n
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        nid = node.id
        for deps, rule, label in ((node.data_deps, "dangling-data-dep", "data_dep"),
                                  (node.ctrl_deps, "dangling-ctrl-dep", "ctrl_dep")):
            for dep in deps:
                if dep == nid:
                    out.append(Violation("self-edge", where, f"the node lists itself in its {label}s", nid))
                    continue
                j = index.get(dep)
                if j is None:
                    out.append(Violation(rule, where, f"{label} {dep} is not a node in this trace", nid))
                    continue
                dependents[j].append(i)
                indegree[i] += 1

    # Kahn's algorithm, iterative: whatever is never freed sits on or behind a cycle.
    ready = [i for i in range(n) if indegree[i] == 0]
    scheduled = 0
    while ready:
        i = ready.pop()
        scheduled += 1
        for k in dependents[i]:
            indegree[k] -= 1
            if indegree[k] == 0:
                ready.append(k)
    if scheduled < n:
        stuck = [i for i in range(n) if indegree[i] > 0]
        cycle = _find_cycle(nodes, index, stuck)
        # The walk goes node -> dependency; reverse it so the arrows read in execution order, and start at the
        # smallest id so the report is the same whichever node the walk began from.
        ids = [nodes[i].id for i in reversed(cycle)]
        start = ids.index(min(ids))
        ids = ids[start:] + ids[:start]
        shown = " -> ".join(str(x) for x in ids[:_CYCLE_SHOWN])
        more = f" -> ... ({len(ids)} nodes)" if len(ids) > _CYCLE_SHOWN else f" -> {ids[0]}"
        out.append(Violation("cycle", where,
                             f"dependency cycle {shown}{more}; {len(stuck)} nodes can never run", ids[0]))
    return out


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
                                  "network refuses 1 NPU; run it as 2 NPUs (FORMATS.md 3b.7)"))
    # (src, dst, tag) -> [(node id, size, file rank)], one list for sends and one for recvs
    sends: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    recvs: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    # group -> rank -> Counter of comm_type
    collectives: dict[str, dict[int, Counter[int]]] = {}

    for rank in sorted(ranks):
        where = f"rank {rank}"
        group_uses: dict[str, list[int]] = {}  # group -> ids of nodes using it (reported once per group)
        for node in ranks[rank]:
            ntype = node.type
            if ntype not in COMM_NODE_TYPES:
                continue
            attrs = _typed_attrs(node, where, None)
            group = attrs.get("pg_name", "")
            assert isinstance(group, str)
            if group:
                group_uses.setdefault(group, []).append(node.id)
            if ntype == pb.COMM_COLL_NODE:
                if "comm_type" in attrs:
                    per_rank = collectives.setdefault(group, {})
                    per_rank.setdefault(rank, Counter())[int(attrs["comm_type"])] += 1
                continue
            if not all(name in attrs for name in _P2P_REQUIRED):
                continue  # check_nodes reports it; it cannot be matched
            src, dst = int(attrs["comm_src"]), int(attrs["comm_dst"])
            tag, size = int(attrs["comm_tag"]), int(attrs["comm_size"])
            is_send = ntype == pb.COMM_SEND_NODE
            own = src if is_send else dst
            if own != rank:
                field = "comm_src" if is_send else "comm_dst"
                kind = "send" if is_send else "recv"
                out.append(Violation("p2p-rank", where,
                                     f"{kind} has {field} {own}, but its file is rank {rank}", node.id))
            (sends if is_send else recvs).setdefault((src, dst, tag), []).append((node.id, size, rank))

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

    _check_collective_counts(collectives, present, comm_group, out)
    _match_p2p(sends, recvs, present, out, notes)
    return out


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
