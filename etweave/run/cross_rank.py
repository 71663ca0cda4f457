"""Cross-rank work on converted ranks: process-group ids, collective sequence checks, transfer durations, rank
start offsets, and the checks of the whole run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from etweave import __version__
from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import attr_value, parse, serialize
from etweave.check import Violation, check_nodes, check_run, comm_type_name
from etweave.collectives import classify
from etweave.convert import assign_group_ids
from etweave.deps.evidence import Evidence
from etweave.errors import BadInput, CheckFailed
from etweave.fidelity import RANK_START_OFFSET
from etweave.model import PROCESS_ROOT
from etweave.nodes import DEP_EVIDENCE, MARKER_KINDS
from etweave.run.discover import Discovery

# Kinds whose members must all pass the same byte count (all_to_all(v), gather and scatter legitimately differ).
_EQUAL_SIZE = frozenset({pb.ALL_REDUCE, pb.REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.REDUCE_SCATTER_BLOCK,
                         pb.BROADCAST, pb.BARRIER})
# Cross-rank violations that --allow-mismatch turns into report entries instead of a failure.
_MISMATCH_RULES = frozenset({"coll-mismatch", "p2p-match"})
_SHOWN = 10


@dataclass(slots=True)
class CollSig:
    """What one rank has at one position of a group's collective sequence."""

    node: int
    name: str
    kind: int
    size: int
    seq: int | None
    start: int
    end: int  # start + measured (inclusive) duration

    def describe(self, with_seq: bool = True) -> str:
        seq = f" seq {self.seq}" if with_seq and self.seq is not None else ""
        return f"{self.name} ({comm_type_name(self.kind)}) {self.size} B{seq}, node {self.node}"


class RankStreams(Mapping[int, tuple[pb.GlobalMetadata, list[pb.Node]]]):
    """Each rank's final `.et` stream, kept as bytes: a rank is parsed into protobuf nodes only when it is looked
    up, so a run of a thousand ranks never holds every rank's graph as Python objects (`stream` gives the bytes
    that `write_run` writes)."""

    def __init__(self) -> None:
        self._streams: dict[int, bytes] = {}
        self.node_counts: dict[int, int] = {}

    def put(self, rank: int, metadata: pb.GlobalMetadata, nodes: list[pb.Node]) -> None:
        self._streams[rank] = serialize(metadata, nodes)
        self.node_counts[rank] = len(nodes)

    def stream(self, rank: int) -> bytes:
        return self._streams[rank]

    def __getitem__(self, rank: int) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
        return parse(self._streams[rank])

    def __iter__(self) -> Iterator[int]:
        return iter(self._streams)

    def __len__(self) -> int:
        return len(self._streams)


@dataclass(slots=True)
class RunResult:
    ranks: RankStreams
    comm_group: dict[str, list[int]]
    report: dict[str, Any]
    consistent: bool
    messages: list[str]  # divergences and failing checks, one line each (what the CLI prints on failure)

    def __repr__(self) -> str:  # the default would print every node of every rank
        nodes = sum(self.ranks.node_counts.values())
        state = "consistent" if self.consistent else "NOT consistent"
        return (f"RunResult({len(self.ranks)} rank(s) {sorted(self.ranks)}, {nodes} nodes, "
                f"{len(self.comm_group)} listed process group(s), {state})")


def _range_text(ranks: Iterable[int]) -> str:
    """0-2,4,6-7."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def _group_label(gid: str) -> str:
    return "the world group" if gid == "" else f"group {gid}"


def build_comm_group(outputs: Sequence[dict[str, Any]], world: int | None
                     ) -> tuple[dict[str, list[int]], dict[str, str], list[str]]:
    """(comm_group map id -> ranks, trace pg name -> id ("" = world), notes) from every rank's descriptions."""
    notes: list[str] = []
    ranks_of: dict[str, list[int]] = {}
    for out in outputs:
        for grp in out["groups"]:
            ranks = grp["ranks"]
            if ranks is None:
                continue
            known = ranks_of.setdefault(grp["name"], ranks)
            # [] means all ranks: it agrees with an explicit list of the world, so only two lists can conflict
            if known != ranks and ranks and known:
                notes.append(f"process group {grp['name']!r}: rank {out['rank']} ({grp['source']}) lists ranks "
                             f"{_range_text(ranks)}, another source {_range_text(known)}; kept the first")
    ids: dict[str, str] = {}
    subgroups: list[tuple[list[int], str]] = []
    for name, ranks in ranks_of.items():
        if ranks == [] or (world is not None and ranks == list(range(world))):
            ids[name] = ""
        else:
            subgroups.append((ranks, name))
    # Ids in a rank-list order that is the same on every run, so an id never depends on which rank was read first.
    ids.update(assign_group_ids([name for _ranks, name in sorted(subgroups)]))
    comm_group = {ids[name]: ranks for ranks, name in subgroups}
    return dict(sorted(comm_group.items(), key=lambda kv: int(kv[0]))), ids, notes


def _attr(node: pb.Node, name: str) -> pb.AttributeProto | None:
    for a in node.attr:
        if a.name == name:
            return a
    return None


def _int_attr(node: pb.Node, name: str) -> int | None:
    a = _attr(node, name)
    if a is None:
        return None
    value = attr_value(a)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _signature(node: pb.Node) -> CollSig:
    name_attr = _attr(node, "collective_name")
    name = str(attr_value(name_attr)) if name_attr is not None else ""
    comm_type = _int_attr(node, "comm_type") or 0
    kind = classify(name) if name else None
    measured = _int_attr(node, "measured_duration_micros")
    start = node.start_time_micros
    return CollSig(node=node.id, name=name or comm_type_name(comm_type),
                   kind=kind if isinstance(kind, int) else comm_type, size=_int_attr(node, "comm_size") or 0,
                   seq=_int_attr(node, "comm_seq"), start=start,
                   end=start + (measured if measured is not None else node.duration_micros))


def _key(sig: CollSig | None, with_seq: bool) -> tuple[Any, ...] | None:
    if sig is None:
        return None
    return (sig.kind, sig.seq if with_seq else None, sig.size if sig.kind in _EQUAL_SIZE else None)


def check_sequences(seqs: dict[int, list[CollSig]]) -> tuple[list[dict[str, Any]], int]:
    """First divergence per member rank from the majority sequence, and the length of the prefix on which all
    members agree (the collectives that match across ranks)."""
    members = sorted(seqs)
    longest = max((len(s) for s in seqs.values()), default=0)
    diverged: dict[int, dict[str, Any]] = {}
    matched = longest
    for i in range(longest):
        at = {r: seqs[r][i] if i < len(seqs[r]) else None for r in members}
        with_seq = all(s is not None and s.seq is not None for s in at.values())
        keys = {r: _key(s, with_seq) for r, s in at.items()}
        counts = Counter(keys[r] for r in members)  # insertion in rank order: a tie goes to the lowest rank
        majority = counts.most_common(1)[0][0]
        agreeing = [r for r in members if keys[r] == majority]
        for r in members:
            if keys[r] != majority and r not in diverged:
                sig, ref = at[r], at[agreeing[0]]
                diverged[r] = {
                    "rank": r, "index": i,
                    "has": sig.describe(with_seq) if sig is not None else "no collective (its sequence ended)",
                    "expected": ref.describe(with_seq) if ref is not None else "no collective (their sequences end)",
                    "expected_on": agreeing,
                }
        if len(agreeing) < len(members):
            matched = min(matched, i)
    return [diverged[r] for r in sorted(diverged)], matched


def _adjust(seqs: dict[int, list[CollSig]], matched: int, nodes_by_id: dict[int, dict[int, pb.Node]],
            stats: Counter[str], biggest: list[int], parts: dict[int, dict[int, list[pb.Node]]] | None = None) -> None:
    """Collective durations without the wait for the slowest peer (see the module docstring). On the gloo path
    the op's later periods (`parts`: comm node id -> its `[self]` nodes in order) hold the rest of that wait:
    they lose what the node itself could not, so a thread that waits for the collective's end (a wake-up edge)
    does not wait for the slowest peer twice, once in the replay's rendezvous and once in the stored time."""
    for i in range(matched):
        sigs = {r: s[i] for r, s in seqs.items()}
        if any(s.start <= 0 for s in sigs.values()):
            stats["unmeasured"] += 1
            continue  # an unmeasured start says nothing about when the peers were ready
        latest = max(s.start for s in sigs.values())
        if latest >= min(s.end for s in sigs.values()):
            # A member ended before another began: impossible for one collective on one clock, so these are
            # not the same operation (p2p kernels paired by position) or the ranks' clocks differ. Leave them.
            stats["not_overlapping"] += 1
            continue
        for r, sig in sigs.items():
            node = nodes_by_id[r][sig.node]
            measured = sig.end - sig.start
            transfer = max(0, sig.end - latest)
            if measured > 0:
                transfer = max(1, transfer)
            # Never lengthen: on the gloo path the node is only the first period of its op (the rest, waits
            # included, sits in later [self] nodes), so end - latest start can exceed the node's own duration.
            new = min(node.duration_micros, transfer)
            stats["collectives"] += 1
            if new < node.duration_micros:
                stats["adjusted"] += 1
                biggest[0] = max(biggest[0], node.duration_micros - new)
            if measured > node.duration_micros + 1:  # +1: rounding the ends vs rounding the length
                stats["split_ops"] += 1
            left = max(0, latest - sig.start) - (node.duration_micros - new)  # the wait not cut from the node
            for part in (parts or {}).get(r, {}).get(node.id, ()):
                cut = min(part.duration_micros, left)
                if cut > 0:
                    part.duration_micros -= cut
                    left -= cut
                    stats["parts_adjusted"] += 1
            node.duration_micros = new
            a = _attr(node, "transfer_duration_micros")
            if a is None:
                a = node.attr.add(name="transfer_duration_micros")
            a.int64_val = new


def assemble_run(outputs: Sequence[dict[str, Any]], allow_mismatch: bool = False,
                 discovery: Discovery | None = None) -> RunResult:
    """Cross-rank work on converted ranks (no I/O): comm groups, pg_name rewrite, sequence check, durations,
    checks. Raises CheckFailed on a check violation; a divergence sets `consistent` (the caller decides)."""
    by_rank: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    for out in outputs:
        if out["rank"] in by_rank:
            raise BadInput(f"rank {out['rank']}", "two inputs convert to the same rank")
        by_rank[out["rank"]] = out
        tr = out["trace_rank"]
        if tr is not None and tr != out["rank"]:
            notes.append(f"rank {out['rank']}: its Kineto trace says rank {tr}; the folder/file name was used")
    worlds = {o["world_size"] for o in outputs if o["world_size"] is not None}
    world = max(worlds) if worlds else None
    if len(worlds) > 1:
        notes.append(f"ranks disagree on the world size ({sorted(worlds)}); used {world}")
    comm_group, ids, group_notes = build_comm_group(outputs, world)
    notes += group_notes

    # Pass 1, one rank at a time: rewrite pg names, keep only what the cross-rank work needs (each rank's
    # collective sequence, its comm nodes and their later periods, its first measured start) and the stream.
    first_pass: dict[int, bytes] = {}
    starts: dict[int, int] = {}
    rewritten = 0
    # group id -> rank -> its collectives in ascending id (the order the simulator matches them in)
    seqs: dict[str, dict[int, list[CollSig]]] = {}
    nodes_by_id: dict[int, dict[int, pb.Node]] = {}  # rank -> comm node id -> node (edited by _adjust)
    comm_nodes: dict[int, list[pb.Node]] = {}  # rank -> every comm node (what check_run reads)
    parts: dict[int, dict[int, list[pb.Node]]] = {}  # rank -> comm node id -> its later periods, in order
    for rank in sorted(by_rank):
        metadata, nodes = parse(by_rank[rank].pop("et"))  # popped: only one copy of each stream at a time
        # Local ids (as this rank's converter numbered them) back to trace names, then to the run-wide ids.
        local_to_global: dict[str, str] = {}
        for name, local in by_rank[rank]["local_groups"].items():
            if local and name in ids:
                local_to_global.setdefault(local, ids[name])
        comm = [n for n in nodes if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]
        for node in comm:
            a = _attr(node, "pg_name")
            if a is not None and a.string_val in local_to_global and local_to_global[a.string_val] != a.string_val:
                a.string_val = local_to_global[a.string_val]
                rewritten += 1
        comm_nodes[rank] = comm
        starts[rank] = _first_start(nodes)
        colls = {n.id: n for n in comm if n.type == pb.COMM_COLL_NODE}
        nodes_by_id[rank] = colls
        for node in sorted(colls.values(), key=lambda n: n.id):
            a = _attr(node, "pg_name")
            gid = a.string_val if a is not None else ""
            seqs.setdefault(gid, {}).setdefault(rank, []).append(_signature(node))
        for n in nodes:
            owner = _int_attr(n, "part_of") if n.type == pb.COMP_NODE and colls else None
            if owner is not None and owner in colls:
                parts.setdefault(rank, {}).setdefault(owner, []).append(n)
        first_pass[rank] = serialize(metadata, nodes)
        del metadata, nodes

    present = sorted(by_rank)
    world_members = list(range(world)) if world is not None else present
    absent_ranks = sorted(set(present) - set(world_members))
    if absent_ranks:
        notes.append(f"ranks {_range_text(absent_ranks)} are beyond the world size {world}")
        world_members = sorted(set(world_members) | set(present))

    stats: Counter[str] = Counter()
    biggest = [0]
    groups_report: list[dict[str, Any]] = []
    messages: list[str] = []
    consistent = True
    for gid in sorted(set(seqs) | set(comm_group), key=lambda g: (g != "", int(g) if g.isdecimal() else 0, g)):
        if gid == "":
            members = world_members
        elif gid in comm_group:
            members = comm_group[gid]
        else:
            continue  # an id outside the map: check_run reports it (pg-name)
        here = [r for r in members if r in by_rank]
        absent = len(members) - len(here)
        if not here:
            continue
        member_seqs = {r: seqs.get(gid, {}).get(r, []) for r in here}
        divergences, matched = check_sequences(member_seqs)
        _adjust(member_seqs, matched, nodes_by_id, stats, biggest, parts)
        entry: dict[str, Any] = {
            "group": gid, "members": len(members), "present": _range_text(here), "absent": absent,
            "collectives_per_rank": {str(r): len(s) for r, s in member_seqs.items()},
            "matched": matched, "consistent": not divergences, "divergences": divergences,
        }
        groups_report.append(entry)
        label = _group_label(gid)
        if absent:
            notes.append(f"{absent} members of {label} are absent (the run has {len(here)} of {len(members)}: "
                         f"ranks {_range_text(here)}); checked the members present")
        for d in divergences:
            consistent = False
            messages.append(f"{label}: rank {d['rank']} diverges at collective index {d['index']}: it has {d['has']}; "
                            f"rank(s) {_range_text(d['expected_on'])} have {d['expected']}")

    # Pass 2, one rank at a time: the edited comm nodes and periods in place of their originals, the rank start
    # offset, the per-rank checks, the final stream.
    measured_starts = [t for t in starts.values() if t > 0]
    run_t0 = min(measured_starts) if measured_starts else None
    offsets: dict[int, int] = {}
    ranks = RankStreams()
    violations: list[Violation] = []
    check_warnings: list[Violation] = []  # runs in ASTRA-sim, but not as measured (etweave.check)
    for rank in sorted(first_pass):
        metadata, nodes = parse(first_pass.pop(rank))
        edited = {n.id: n for n in comm_nodes[rank]}
        for periods in parts.get(rank, {}).values():
            edited.update((n.id, n) for n in periods)
        if edited:
            nodes = [edited.get(n.id, n) for n in nodes]
        if run_t0 is not None:
            offsets[rank] = _add_start_offset(nodes, starts[rank], run_t0)
            report = by_rank[rank].get("report")
            if isinstance(report, dict) and "nodes" in report:
                report["nodes"] = len(nodes)  # the offset node is in the file: the report counts what it holds
        violations += check_nodes(nodes, f"rank {rank}", check_warnings)
        ranks.put(rank, metadata, nodes)
        del metadata, nodes
    run_notes: list[Violation] = []
    across = check_run(comm_nodes, comm_group, run_notes, check_warnings)
    # Ranks that disagree are the user's input, not a broken conversion: the caller fails on them unless told
    # to allow them; every other violation fails the run.
    mismatches = [v for v in across if v.rule in _MISMATCH_RULES]
    violations += [v for v in across if v.rule not in _MISMATCH_RULES]
    if mismatches:
        consistent = False
        messages += [str(v) for v in mismatches]

    report: dict[str, Any] = {
        "etweave_version": __version__,
        "ranks": {str(r): by_rank[r]["report"] for r in sorted(by_rank)},
        "inputs": {str(r): {"host": by_rank[r].get("host"), "kineto": by_rank[r].get("kineto")}
                   for r in sorted(by_rank)},
        "ignored_files": list(discovery.ignored) if discovery else [],
        "world_size": world,
        "comm_group": dict(comm_group),
        "process_group_ids": dict(sorted(ids.items())),
        "pg_name_rewritten": rewritten,
        "rank_start_offsets_micros": {str(r): v for r, v in sorted(offsets.items())},
        "cross_rank": {
            "consistent": consistent,
            "allow_mismatch": allow_mismatch,
            "groups": groups_report,
            "violations": [_as_dict(v) for v in violations],
            "mismatches": [_as_dict(v) for v in mismatches],
            "notes": [_as_dict(v) for v in run_notes],
            "check_warnings": dict(sorted(Counter(v.rule for v in check_warnings).items())),
        },
        "durations": {
            "comm_nodes_matched": stats["collectives"],
            "adjusted": stats["adjusted"],
            "max_adjustment_micros": biggest[0],
            # comm nodes that are only the first period of their op (gloo ops with child ops): the rest of their
            # wait for the slowest member is cut from the op's later [self] nodes (`parts_adjusted` of them)
            "split_ops": stats["split_ops"],
            "parts_adjusted": stats["parts_adjusted"],
            "unmeasured_matches": stats["unmeasured"],
            "not_overlapping_matches": stats["not_overlapping"],
        },
        "notes": notes,
    }
    if violations:
        shown = "; ".join(str(v) for v in violations[:_SHOWN])
        more = f" (and {len(violations) - _SHOWN} more)" if len(violations) > _SHOWN else ""
        raise CheckFailed(f"{len(violations)} violation(s) in the converted run, nothing written: {shown}{more}")
    return RunResult(ranks, comm_group, report, consistent, messages)


def _kind(node: pb.Node) -> str | None:
    a = _attr(node, "kind")
    return a.string_val if a is not None else None


def _first_start(nodes: Sequence[pb.Node]) -> int:
    """The rank's first measured instant (0 when nothing is measured)."""
    return min((n.start_time_micros for n in nodes if n.start_time_micros > 0), default=0)


def _add_start_offset(nodes: list[pb.Node], start: int, run_t0: int) -> int:
    """Ranks start their recorded work at different times (dlrm's up to 7 ms apart). A rank that started later
    than the run's first measured instant (`run_t0`) gets a `[rank start offset]` delay node that its sources
    (the nodes whose only predecessor is the process root, or none) wait for, so a replay starts every rank
    where it started, on one clock. Returns the rank's offset in µs."""
    offset = start - run_t0 if start > 0 else 0
    if offset <= 0:
        return offset
    # Roots are zero-duration COMP_NODEs told apart by their `kind` attr (METADATA_NODE in older outputs)
    markers = {n.id for n in nodes if n.type == pb.METADATA_NODE or _kind(n) in MARKER_KINDS}
    roots = {n.id for n in nodes if n.id in markers and not n.data_deps and not n.ctrl_deps
             and _kind(n) == PROCESS_ROOT}
    delay = pb.Node(id=max(n.id for n in nodes) + 1, name=RANK_START_OFFSET, type=pb.COMP_NODE,
                    data_deps=sorted(roots), start_time_micros=run_t0, duration_micros=offset)
    delay.attr.add(name="kind", string_val="delay")
    delay.attr.add(name="is_cpu_op", bool_val=True)
    delay.attr.add(name="num_ops", int64_val=0)  # every COMP_NODE has both (FORMATS.md 3b.3)
    delay.attr.add(name="tensor_size", uint64_val=0)
    evidence = [Evidence.RANK_START_OFFSET.value] * len(delay.data_deps)
    delay.attr.add(name=DEP_EVIDENCE).string_list.values.extend(evidence)
    for n in nodes:
        # sources of the rank, and its thread roots (everything on a thread follows its root)
        if (n.id not in markers and set(n.data_deps) <= roots and not n.ctrl_deps) or (
                n.id in markers and n.id not in roots and set(n.data_deps) <= roots):
            n.data_deps.append(delay.id)
            _add_evidence(n, Evidence.RANK_START_OFFSET.value)
    nodes.append(delay)
    return offset


def _add_evidence(node: pb.Node, source: str) -> None:
    """Keep attr dep_evidence aligned with data_deps after appending one."""
    for a in node.attr:
        if a.name == DEP_EVIDENCE:
            a.string_list.values.append(source)
            return
    node.attr.add(name=DEP_EVIDENCE).string_list.values.extend(["unknown"] * (len(node.data_deps) - 1) + [source])


def _as_dict(v: Violation) -> dict[str, Any]:
    return {"rule": v.rule, "where": v.where, "node": v.node, "message": v.message}
