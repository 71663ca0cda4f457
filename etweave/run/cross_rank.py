"""Cross-rank work on converted ranks: process-group ids, collective sequence checks, transfer durations, rank
start offsets, and the checks of the whole run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import comm_type_name
from etweave.chakra.io import attr_value, parse
from etweave.check import EncodedNodes, Violation, check_each, check_nodes, check_run
from etweave.collectives import classify
from etweave.deps.evidence import Evidence
from etweave.errors import BadInput, CheckFailed
from etweave.fidelity import RANK_START_OFFSET
from etweave.matching import collective_instances
from etweave.nodes import DEP_EVIDENCE
from etweave.output import discard, stage
from etweave.process_groups import assign_group_ids
from etweave.run.discover import Discovery
from etweave.run.summary import PART_OF, RankSummary, message, parsed, splice, summarize
from etweave.run.workers import ConvertedRank
from etweave.runfolder import CommGroups, et_file_name
from etweave.version import __version__

# Kinds whose members must all pass the same byte count (all_to_all(v), gather and scatter legitimately differ).
_EQUAL_SIZE = frozenset({pb.ALL_REDUCE, pb.REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.REDUCE_SCATTER_BLOCK,
                         pb.BROADCAST, pb.BARRIER})
# Cross-rank violations that --allow-mismatch turns into report entries instead of a failure.
_MISMATCH_RULES = frozenset({"coll-mismatch", "p2p-match"})
_SHOWN = 10


class CollSig(msgspec.Struct):
    """What one rank has at one position of a group's collective sequence."""

    node: int
    name: str
    kind: int
    size: int
    seq: int | None
    start: int
    end: int  # start + measured (inclusive) duration, less a record tail (record_tail_micros)

    def describe(self, with_seq: bool = True) -> str:
        seq = f" seq {self.seq}" if with_seq and self.seq is not None else ""
        return f"{self.name} ({comm_type_name(self.kind)}) {self.size} B{seq}, node {self.node}"


class RankStreams(Mapping[int, tuple[pb.GlobalMetadata, list[pb.Node]]]):
    """Each rank's final `.et` stream: a rank is parsed into protobuf nodes only when it is looked up, so a run of a
    thousand ranks never holds every rank's graph as Python objects. Kept as bytes, or, given an output folder,
    staged there as each rank is final (`etweave.output.stage`: a temporary file beside `<prefix>.<rank>.et`, which
    `write_run` renames into place with the run's other outputs), so the parent never holds every rank's bytes."""

    def __init__(self, folder: Path | None = None, prefix: str = "trace") -> None:
        self._streams: dict[int, bytes | Path] = {}
        self._folder, self._prefix = folder, prefix
        self.node_counts: dict[int, int] = {}

    def put(self, rank: int, data: bytes, nodes: int) -> None:
        """The rank's final stream, of `nodes` nodes."""
        if self._folder is None:
            self._streams[rank] = data
        else:
            self._streams[rank] = stage(self.target(rank), data, clean=False)  # the folder was cleaned once, locked
        self.node_counts[rank] = nodes

    def target(self, rank: int) -> Path:
        """Where the rank's file goes (a staged stream only)."""
        assert self._folder is not None
        return self._folder / et_file_name(self._prefix, rank)

    def stages_as(self, folder: Path, prefix: str) -> bool:
        """Whether ranks are staged as `folder`/`<prefix>.<rank>.et`."""
        return self._folder is not None and Path(folder) == self._folder and prefix == self._prefix

    def staged(self) -> list[tuple[int, tuple[Path, Path]]]:
        """rank, (staged file, target) of every rank staged and not yet placed, in rank order (for
        `etweave.output.commit`)."""
        return [(rank, (where, self.target(rank))) for rank, where in sorted(self._streams.items())
                if isinstance(where, Path) and where != self.target(rank)]

    def placed(self) -> None:
        """The staged files were renamed onto their targets: read them there from now on."""
        for rank, where in self._streams.items():
            if isinstance(where, Path):
                self._streams[rank] = self.target(rank)

    def discard(self) -> None:
        """Remove the staged files (a failed run)."""
        discard([where for _, (where, _target) in self.staged()])

    def stream(self, rank: int) -> bytes:
        return _load(self._streams[rank])

    def __getitem__(self, rank: int) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
        return parse(self.stream(rank))

    def __iter__(self) -> Iterator[int]:
        return iter(self._streams)

    def __len__(self) -> int:
        return len(self._streams)


def _load(stream: bytes | Path) -> bytes:
    return stream.read_bytes() if isinstance(stream, Path) else stream


class RunResult(msgspec.Struct):
    ranks: RankStreams
    comm_group: CommGroups  # what comm_group.json holds (`to_json()`)
    report: dict[str, Any]
    consistent: bool
    messages: list[str]  # divergences and failing checks, one line each (what the CLI prints on failure)

    def __repr__(self) -> str:  # the default would print every node of every rank
        nodes = sum(self.ranks.node_counts.values())
        state = "consistent" if self.consistent else "NOT consistent"
        return (f"RunResult({len(self.ranks)} rank(s) {sorted(self.ranks)}, {nodes} nodes, "
                f"{len(self.comm_group.members)} listed process group(s), {state})")


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


def build_comm_group(outputs: Sequence[ConvertedRank], world: int | None) -> CommGroups:
    """The run's process-group map from every rank's descriptions: ids -> ranks, each trace pg name's id ("" =
    the world group), and notes on descriptions that disagree."""
    notes: list[str] = []
    ranks_of: dict[str, tuple[int, ...]] = {}
    for out in outputs:
        for grp in out.groups:
            ranks = grp.ranks
            if ranks is None:
                continue
            name = grp.name if grp.name is not None else ""
            known = ranks_of.setdefault(name, ranks)
            # () means all ranks: it agrees with an explicit list of the world, so only two lists can conflict
            if known != ranks and ranks and known:
                notes.append(f"process group {name!r}: rank {out.rank} ({grp.source.value}) lists ranks "
                             f"{_range_text(ranks)}, another source {_range_text(known)}; kept the first")
    ids: dict[str, str] = {}
    subgroups: list[tuple[tuple[int, ...], str]] = []
    for name, ranks in ranks_of.items():
        if ranks == () or (world is not None and ranks == tuple(range(world))):
            ids[name] = ""
        else:
            subgroups.append((ranks, name))
    # Ids in a rank-list order that is the same on every run, so an id never depends on which rank was read first.
    ids.update(assign_group_ids([name for _ranks, name in sorted(subgroups)]))
    members = {ids[name]: list(ranks) for ranks, name in subgroups}
    return CommGroups(dict(sorted(members.items(), key=lambda kv: int(kv[0]))), ids, tuple(notes))


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
    # the collective's end: where its record outlasted it (a waiter resumed first, docs/FACTS.md §W3), its completion
    tail = _int_attr(node, "record_tail_micros") or 0
    end = start + (measured if measured is not None else node.duration_micros) - tail
    return CollSig(node=node.id, name=name or comm_type_name(comm_type),
                   kind=kind if isinstance(kind, int) else comm_type, size=_int_attr(node, "comm_size") or 0,
                   seq=_int_attr(node, "comm_seq"), start=start, end=end)


def _key(sig: CollSig | None, with_seq: bool) -> tuple[Any, ...] | None:
    if sig is None:
        return None
    return (sig.kind, sig.seq if with_seq else None, sig.size if sig.kind in _EQUAL_SIZE else None)


def check_sequences(seqs: dict[int, list[CollSig]]) -> tuple[list[dict[str, Any]], int]:
    """First divergence per member rank from the majority sequence, and the length of the prefix on which all
    members agree (the collectives that match across ranks). `seqs`: member rank -> its collectives of the group in
    issue order; the i-th of each member is one instance (etweave.matching)."""
    members = sorted(seqs)
    diverged: dict[int, dict[str, Any]] = {}
    matched: int | None = None
    i = -1
    for i, sigs in enumerate(collective_instances(seqs, members)):
        at = dict(zip(members, sigs, strict=True))
        agreeing = _diverging(at, i, diverged)
        if len(agreeing) < len(members) and matched is None:
            matched = i
    return [diverged[r] for r in sorted(diverged)], i + 1 if matched is None else matched


def _diverging(at: dict[int, CollSig | None], index: int, diverged: dict[int, dict[str, Any]]) -> list[int]:
    """The members whose collective at `index` is the majority's (a tie goes to the lowest rank); record the first
    divergence of each other member in `diverged`."""
    with_seq = all(s is not None and s.seq is not None for s in at.values())
    keys = {r: _key(s, with_seq) for r, s in at.items()}
    majority = Counter(keys.values()).most_common(1)[0][0]  # insertion in rank order: a tie goes to the lowest rank
    agreeing = [r for r, key in keys.items() if key == majority]
    for r, key in keys.items():
        if key != majority and r not in diverged:
            sig, ref = at[r], at[agreeing[0]]
            diverged[r] = {
                "rank": r, "index": index,
                "has": sig.describe(with_seq) if sig is not None else "no collective (its sequence ended)",
                "expected": ref.describe(with_seq) if ref is not None else "no collective (their sequences end)",
                "expected_on": agreeing,
            }
    return agreeing


def _adjust(seqs: dict[int, list[CollSig]], matched: int, first: _FirstPass, stats: Counter[str],
            biggest: list[int]) -> None:
    """Collective durations without the wait for the slowest peer (see the module docstring), into
    `first.transfers` (pass 2 writes them into the nodes). On the gloo path the op's later periods (`first.parts`:
    comm node id -> its `[self]` periods in order) hold the rest of that wait: they lose what the node itself
    could not, so a thread that waits for the collective's end (a wake-up edge) does not wait for the slowest
    peer twice, once in the replay's rendezvous and once in the stored time."""
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
            duration = first.durations[r][sig.node]  # (each comm node is one group's, matched once: as converted)
            measured = sig.end - sig.start
            transfer = max(0, sig.end - latest)
            if measured > 0:
                transfer = max(1, transfer)
            # Never lengthen: on the gloo path the node is only the first period of its op (the rest, waits
            # included, sits in later [self] nodes), so end - latest start can exceed the node's own duration.
            new = min(duration, transfer)
            stats["collectives"] += 1
            if new < duration:
                stats["adjusted"] += 1
                biggest[0] = max(biggest[0], duration - new)
            if measured > duration + 1:  # +1: rounding the ends vs rounding the length
                stats["split_ops"] += 1
            left = max(0, latest - sig.start) - (duration - new)  # the wait not cut from the node
            _cut_parts(first.parts.get(r, {}).get(sig.node, ()), left, stats)
            first.transfers.setdefault(r, {})[sig.node] = new


def _set_transfer(node: pb.Node, new: int) -> None:
    """A collective's duration cut to its transfer time (`_adjust`), also kept in attr transfer_duration_micros."""
    node.duration_micros = new
    a = _attr(node, "transfer_duration_micros")
    if a is None:
        a = node.attr.add(name="transfer_duration_micros")
    a.int64_val = new


class _Period(msgspec.Struct):
    """A later period of a collective's op (a node whose part_of names the comm node): its id and duration."""

    node: int
    duration: int


def _cut_parts(parts: Sequence[_Period], left: int, stats: Counter[str]) -> None:
    """Cut `left` µs of wait from an op's later periods, in order, none below 0."""
    for part in parts:
        cut = min(part.duration, left)
        if cut > 0:
            part.duration -= cut
            left -= cut
            stats["parts_adjusted"] += 1


class _FirstPass(msgspec.Struct):
    """What pass 1 keeps of the ranks: only the facts the cross-rank work needs, no node (a parsed node takes about
    2 KB, 6 times its bytes: 16 MB for a thousand ranks' comm nodes); pass 2 parses a rank's comm nodes and
    periods again and writes `_adjust`'s durations into them."""

    streams: dict[int, bytes | Path] = msgspec.field(default_factory=dict)  # rank -> its stream as converted
    summaries: dict[int, RankSummary] = msgspec.field(default_factory=dict)  # rank -> what pass 2 splices
    starts: dict[int, int] = msgspec.field(default_factory=dict)  # rank -> its first measured start (0: none)
    rewritten: int = 0  # pg_name attrs rewritten to the run-wide id
    # group id -> rank -> its collectives in ascending id (the order the simulator matches them in)
    seqs: dict[str, dict[int, list[CollSig]]] = msgspec.field(default_factory=dict)
    # rank -> collective node id -> its duration as converted
    durations: dict[int, dict[int, int]] = msgspec.field(default_factory=dict)
    # rank -> collective node id -> its duration cut to the transfer (`_adjust`; only the matched ones)
    transfers: dict[int, dict[int, int]] = msgspec.field(default_factory=dict)
    parts: dict[int, dict[int, list[_Period]]] = msgspec.field(default_factory=dict)  # rank -> comm node id -> periods
    violations: list[Violation] = msgspec.field(default_factory=list)  # of ranks whose graph was checked here
    warnings: list[Violation] = msgspec.field(default_factory=list)


class _GroupsChecked(msgspec.Struct):
    """The collective sequences of every group, checked: the report entries, divergences, duration stats."""

    report: list[dict[str, Any]] = msgspec.field(default_factory=list)
    messages: list[str] = msgspec.field(default_factory=list)
    consistent: bool = True
    stats: Counter[str] = msgspec.field(default_factory=Counter)
    biggest: list[int] = msgspec.field(default_factory=lambda: [0])  # the largest cut, µs (a cell `_adjust` updates)


class _Checked(msgspec.Struct):
    """Pass 2's result: the final streams, rank start offsets and the violations of the run's checks."""

    ranks: RankStreams
    offsets: dict[int, int]
    violations: list[Violation]
    mismatches: list[Violation]
    notes: list[Violation]
    warnings: list[Violation]


def assemble_run(outputs: list[ConvertedRank], allow_mismatch: bool = False,
                 discovery: Discovery | None = None, ranks: RankStreams | None = None) -> RunResult:
    """Cross-rank work on converted ranks: comm groups, pg_name rewrite, sequence check, durations, checks, each
    rank's final stream put into `ranks` (new, in memory, when not given; `convert_run` gives one that stages
    them in the output folder). Raises CheckFailed on a check violation; a divergence sets `consistent` (the
    caller decides). Takes the `.et` streams out of `outputs` (stream-less copies stay), so each is held once at a
    time; a stream may be a file (`ConvertedRank.et`), read when its rank's turn comes."""
    streams = _take_streams(outputs)
    by_rank, notes = _by_rank(outputs)
    world = _world_size(outputs, notes)
    groups = build_comm_group(outputs, world)
    notes += groups.notes
    first = _first_pass(streams, by_rank, groups.ids)
    checked_groups = _check_groups(first, groups, _world_members(sorted(by_rank), world, notes), notes)
    checked = _second_pass(first, by_rank, groups, RankStreams() if ranks is None else ranks)
    consistent = checked_groups.consistent and not checked.mismatches
    messages = checked_groups.messages + [str(v) for v in checked.mismatches]
    report: dict[str, Any] = {
        "etweave_version": __version__,
        "ranks": {str(r): by_rank[r].report for r in sorted(by_rank)},
        "inputs": {str(r): {"host": by_rank[r].host, "kineto": by_rank[r].kineto} for r in sorted(by_rank)},
        "ignored_files": list(discovery.ignored) if discovery else [],
        "world_size": world,
        "comm_group": groups.to_json(),
        "process_group_ids": dict(sorted(groups.ids.items())),
        "pg_name_rewritten": first.rewritten,
        "rank_start_offsets_micros": {str(r): v for r, v in sorted(checked.offsets.items())},
        "cross_rank": {
            "consistent": consistent,
            "allow_mismatch": allow_mismatch,
            "groups": checked_groups.report,
            "violations": [v.to_json() for v in checked.violations],
            "mismatches": [v.to_json() for v in checked.mismatches],
            "notes": [v.to_json() for v in checked.notes],
            "check_warnings": dict(sorted(Counter(v.rule for v in checked.warnings).items())),
        },
        "durations": _durations(checked_groups),
        "notes": notes,
    }
    if checked.violations:
        violations = checked.violations
        shown = "; ".join(str(v) for v in violations[:_SHOWN])
        more = f" (and {len(violations) - _SHOWN} more)" if len(violations) > _SHOWN else ""
        raise CheckFailed(f"{len(violations)} violation(s) in the converted run, nothing written: {shown}{more}")
    return RunResult(checked.ranks, groups, report, consistent, messages)


def _take_streams(outputs: list[ConvertedRank]) -> dict[int, bytes | Path]:
    """rank -> its stream; `outputs` keeps copies without it (one copy of each stream at a time, freed in turn)."""
    streams: dict[int, bytes | Path] = {}
    for i, out in enumerate(outputs):
        streams.setdefault(out.rank, out.et)
        outputs[i] = replace(out, et=b"")
    return streams


def _by_rank(outputs: Sequence[ConvertedRank]) -> tuple[dict[int, ConvertedRank], list[str]]:
    by_rank: dict[int, ConvertedRank] = {}
    notes: list[str] = []
    for out in outputs:
        if out.rank in by_rank:
            raise BadInput(f"rank {out.rank}", "two inputs convert to the same rank")
        by_rank[out.rank] = out
        tr = out.trace_rank
        if tr is not None and tr != out.rank:
            notes.append(f"rank {out.rank}: its Kineto trace says rank {tr}; the folder/file name was used")
    return by_rank, notes


def _world_size(outputs: Sequence[ConvertedRank], notes: list[str]) -> int | None:
    worlds = {o.world_size for o in outputs if o.world_size is not None}
    world = max(worlds) if worlds else None
    if len(worlds) > 1:
        notes.append(f"ranks disagree on the world size ({sorted(worlds)}); used {world}")
    return world


def _world_members(present: list[int], world: int | None, notes: list[str]) -> list[int]:
    """The ranks of the world group: 0 .. world size - 1, and any rank present beyond it (with a note)."""
    world_members = list(range(world)) if world is not None else present
    absent_ranks = sorted(set(present) - set(world_members))
    if absent_ranks:
        notes.append(f"ranks {_range_text(absent_ranks)} are beyond the world size {world}")
        world_members = sorted(set(world_members) | set(present))
    return world_members


def _first_pass(streams: dict[int, bytes | Path], by_rank: Mapping[int, ConvertedRank], ids: Mapping[str, str]
                ) -> _FirstPass:
    """One rank at a time: parse only the nodes its summary names (comm nodes, their later periods), rewrite pg
    names, keep each rank's collective sequence and first measured start. A rank converted without a summary (a
    hand-built ConvertedRank) is summarized here, and its whole graph checked as its converter would have."""
    first = _FirstPass(streams)
    for rank in sorted(by_rank):
        summary = by_rank[rank].summary
        stream = streams[rank]
        data: bytes | _Spans
        if summary is not None and isinstance(stream, Path):
            # read only the nodes this pass parses (a few of thousands), not the whole file
            data = _Spans(stream, [summary.spans[i] for i in (*summary.comm, *summary.parts)])
        else:
            data = _load(stream)
            summary = summary or _summarized_here(data, rank, first)
        first.summaries[rank] = summary
        comm = [_node_at(data, summary, i) for i in summary.comm]
        first.rewritten += _rewrite_pg_names(comm, _local_to_global(by_rank[rank].local_groups, ids))
        first.starts[rank] = summary.first_start
        colls = {n.id: n for n in comm if n.type == pb.COMM_COLL_NODE}
        first.durations[rank] = {i: n.duration_micros for i, n in colls.items()}
        for node in sorted(colls.values(), key=lambda n: n.id):
            a = _attr(node, "pg_name")
            gid = a.string_val if a is not None else ""
            first.seqs.setdefault(gid, {}).setdefault(rank, []).append(_signature(node))
        for i in summary.parts:
            n = _node_at(data, summary, i)
            owner = _int_attr(n, PART_OF)
            assert owner is not None  # a summary lists a period by its part_of
            first.parts.setdefault(rank, {}).setdefault(owner, []).append(_Period(n.id, n.duration_micros))
        del data, comm, colls
    return first


class _Spans:
    """The bytes of some spans of a stream on disk (each node's, length prefix included), read in one go."""

    def __init__(self, path: Path, spans: Sequence[tuple[int, int]]) -> None:
        self.framed: dict[tuple[int, int], bytes] = {}
        with open(path, "rb") as f:
            for start, end in sorted(spans):
                f.seek(start)
                self.framed[start, end] = f.read(end - start)


def _summarized_here(data: bytes, rank: int, first: _FirstPass) -> RankSummary:
    nodes, spans = parsed(data)
    first.violations += check_nodes(nodes, f"rank {rank}", first.warnings, in_full=())
    return summarize(data, nodes, spans)


def _node_at(data: bytes | _Spans, summary: RankSummary, node_id: int) -> pb.Node:
    span = summary.spans[node_id]
    try:
        if isinstance(data, _Spans):
            framed = data.framed[span]
            return pb.Node.FromString(message(framed, (0, len(framed))))
        return pb.Node.FromString(message(data, span))
    except Exception as exc:  # protobuf's DecodeError: a stream changed since it was summarized
        raise BadInput("<memory>", f"not a Chakra .et stream: {exc}") from exc


def _local_to_global(local_groups: Mapping[str, str], ids: Mapping[str, str]) -> dict[str, str]:
    """Local ids (as a rank's converter numbered them) back to trace names, then to the run-wide ids."""
    local_to_global: dict[str, str] = {}
    for name, local in local_groups.items():
        if local and name in ids:
            local_to_global.setdefault(local, ids[name])
    return local_to_global


def _rewrite_pg_names(comm: Sequence[pb.Node], local_to_global: Mapping[str, str]) -> int:
    rewritten = 0
    for node in comm:
        a = _attr(node, "pg_name")
        if a is not None and a.string_val in local_to_global and local_to_global[a.string_val] != a.string_val:
            a.string_val = local_to_global[a.string_val]
            rewritten += 1
    return rewritten


def _check_groups(first: _FirstPass, groups: CommGroups, world_members: list[int], notes: list[str]
                  ) -> _GroupsChecked:
    """Every group's collective sequences checked on its members present, and the matched ones' durations cut
    to the transfer (`_adjust`)."""
    out = _GroupsChecked()
    present = first.starts.keys()
    for gid in sorted(set(first.seqs) | set(groups.members),
                      key=lambda g: (g != "", int(g) if g.isdecimal() else 0, g)):
        if gid == "":
            members = world_members
        elif gid in groups.members:
            members = groups.members[gid]
        else:
            continue  # an id outside the map: check_run reports it (pg-name)
        here = [r for r in members if r in present]
        if here:
            _check_group(first, gid, members, here, out, notes)
    return out


def _check_group(first: _FirstPass, gid: str, members: list[int], here: list[int], out: _GroupsChecked,
                 notes: list[str]) -> None:
    absent = len(members) - len(here)
    member_seqs = {r: first.seqs.get(gid, {}).get(r, []) for r in here}
    divergences, matched = check_sequences(member_seqs)
    _adjust(member_seqs, matched, first, out.stats, out.biggest)
    out.report.append({
        "group": gid, "members": len(members), "present": _range_text(here), "absent": absent,
        "collectives_per_rank": {str(r): len(s) for r, s in member_seqs.items()},
        "matched": matched, "consistent": not divergences, "divergences": divergences,
    })
    label = _group_label(gid)
    if absent:
        notes.append(f"{absent} members of {label} are absent (the run has {len(here)} of {len(members)}: "
                     f"ranks {_range_text(here)}); checked the members present")
    for d in divergences:
        out.consistent = False
        out.messages.append(f"{label}: rank {d['rank']} diverges at collective index {d['index']}: it has "
                            f"{d['has']}; rank(s) {_range_text(d['expected_on'])} have {d['expected']}")


def _second_pass(first: _FirstPass, by_rank: Mapping[int, ConvertedRank], groups: CommGroups,
                 ranks: RankStreams) -> _Checked:
    """One rank at a time: its final stream, the converted one with the edited comm nodes and periods in place of
    their originals and the rank start offset added (`splice`: no other node is parsed), the changed nodes
    checked, the stream put into `ranks`; then the checks across ranks."""
    measured_starts = [t for t in first.starts.values() if t > 0]
    run_t0 = min(measured_starts) if measured_starts else None
    checked = _Checked(ranks, {}, list(first.violations), [], [], list(first.warnings))
    comm_of: dict[int, list[bytes]] = {}  # rank -> its final comm nodes, encoded (check_run's, parsed in turn)
    for rank in sorted(by_rank):
        data = _load(first.streams.pop(rank))
        summary = first.summaries.pop(rank)
        comm = [_node_at(data, summary, i) for i in summary.comm]
        _rewrite_pg_names(comm, _local_to_global(by_rank[rank].local_groups, groups.ids))  # as pass 1 did
        transfers = first.transfers.pop(rank, {})
        for node in comm:
            if node.id in transfers:
                _set_transfer(node, transfers[node.id])
        edited = {n.id: n for n in comm}
        durations = {p.node: p.duration for periods in first.parts.pop(rank, {}).values() for p in periods}
        for i in summary.parts:
            period = edited[i] = _node_at(data, summary, i)
            period.duration_micros = durations[i]
        delay = None
        if run_t0 is not None:
            checked.offsets[rank], delay = _start_offset(data, summary, first.starts[rank], run_t0, edited)
            report = by_rank[rank].report
            if "nodes" in report:
                report["nodes"] = summary.nodes + (delay is not None)  # the report counts what the file holds
        # every node was checked when its rank was converted: again only those changed since, in stream order
        in_order = sorted(edited.values(), key=lambda n: summary.spans[n.id])
        checked.violations += check_each([*in_order, *([delay] if delay else [])], f"rank {rank}", checked.warnings)
        encoded = {n.id: n.SerializeToString(deterministic=True) for n in in_order}
        appended = delay.SerializeToString(deterministic=True) if delay is not None else b""
        checked.ranks.put(rank, splice(data, summary.spans, encoded, appended), summary.nodes + (delay is not None))
        comm_of[rank] = [encoded[n.id] for n in comm]
        del data, comm, edited, in_order, encoded
    across = check_run(EncodedNodes(comm_of), groups.members, checked.notes, checked.warnings)
    # Ranks that disagree are the user's input, not a broken conversion: the caller fails on them unless told
    # to allow them; every other violation fails the run.
    checked.mismatches.extend(v for v in across if v.rule in _MISMATCH_RULES)
    checked.violations.extend(v for v in across if v.rule not in _MISMATCH_RULES)
    return checked


def _durations(checked: _GroupsChecked) -> dict[str, int]:
    stats = checked.stats
    return {
        "comm_nodes_matched": stats["collectives"],
        "adjusted": stats["adjusted"],
        "max_adjustment_micros": checked.biggest[0],
        # comm nodes that are only the first period of their op (gloo ops with child ops): the rest of their
        # wait for the slowest member is cut from the op's later [self] nodes (`parts_adjusted` of them)
        "split_ops": stats["split_ops"],
        "parts_adjusted": stats["parts_adjusted"],
        "unmeasured_matches": stats["unmeasured"],
        "not_overlapping_matches": stats["not_overlapping"],
    }


def _start_offset(data: bytes, summary: RankSummary, start: int, run_t0: int, edited: dict[int, pb.Node]
                  ) -> tuple[int, pb.Node | None]:
    """Ranks start their recorded work at different times (dlrm's up to 7 ms apart). A rank that started later
    than the run's first measured instant (`run_t0`) gets a `[rank start offset]` delay node that its sources and
    thread roots (`summary.offset_targets`) wait for, so a replay starts every rank where it started, on one
    clock. The rank's offset in µs, and the delay node (None: no offset); each node it changes goes into
    `edited`."""
    offset = start - run_t0 if start > 0 else 0
    if offset <= 0:
        return offset, None
    delay = pb.Node(id=summary.next_id, name=RANK_START_OFFSET, type=pb.COMP_NODE,
                    data_deps=summary.roots, start_time_micros=run_t0, duration_micros=offset)
    delay.attr.add(name="kind", string_val="delay")
    delay.attr.add(name="is_cpu_op", bool_val=True)
    delay.attr.add(name="num_ops", int64_val=0)  # every COMP_NODE has both (docs/FACTS.md §A3)
    delay.attr.add(name="tensor_size", uint64_val=0)
    evidence = [Evidence.RANK_START_OFFSET.value] * len(delay.data_deps)
    delay.attr.add(name=DEP_EVIDENCE).string_list.values.extend(evidence)
    for node_id in summary.offset_targets:
        n = edited.get(node_id)
        if n is None:  # not a comm node or period: parsed now
            n = edited[node_id] = _node_at(data, summary, node_id)
        n.data_deps.append(delay.id)
        _add_evidence(n, Evidence.RANK_START_OFFSET.value)
    return offset, delay


def _add_evidence(node: pb.Node, source: str) -> None:
    """Keep attr dep_evidence aligned with data_deps after appending one."""
    for a in node.attr:
        if a.name == DEP_EVIDENCE:
            a.string_list.values.append(source)
            return
    node.attr.add(name=DEP_EVIDENCE).string_list.values.extend(["unknown"] * (len(node.data_deps) - 1) + [source])
