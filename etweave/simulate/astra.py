"""`etweave simulate --model astra-sim`: ASTRA-sim's issue rules, so etweave predicts what ASTRA-sim computes.

The rules, as measured on the real simulator (docs/FACTS.md §A2, §A3, §A4):
- Per NPU (rank) one CPU slot (every `is_cpu_op` COMP node, whatever its thread), one GPU-compute slot (every
  other COMP node, whatever its stream) and one comm slot (collectives and sends, by node type whatever their
  `is_cpu_op`); COMM_RECV takes no slot.
  `slots=False` drops the slots (every ready node issues at once), to see what they cost.
- A node is ready when all its data_deps and ctrl_deps are done. Whenever a node finishes, the NPU's ready
  nodes are visited in ascending id and each issues if its slot is free (`Workload::issue_dep_free_nodes`).
- Time is integer ns. A COMP node lasts `duration_micros × 1000`, 0 → 1 ns; `start_time_micros` is not read.
  METADATA_NODE (older etweave output) is read as a COMP node. `is_cpu_op` missing reads as true (the feeder's
  default).
- ALL_REDUCE / ALL_GATHER / REDUCE_SCATTER / ALL_TO_ALL: the k-th collective of a group on each member (ascending
  id) is one instance; it holds the comm slot from issue, starts when the last member issued it and lasts
  `network.collective_ns(comm_size)` (`collectives="network"`) or each node's own `duration_micros`
  (`collectives="duration"`, the second run beside it). BROADCAST always lasts its own `duration_micros`, with no
  cross-rank synchronization. Other collective types make ASTRA-sim throw: a GraphError here.
- Send/recv: the k-th send S→D with tag T matches the k-th recv on D from S with tag T (ascending id). A send
  lasts its network time (or its duration); the recv ends when both it was issued and the send's message
  arrived. A peer outside the NPUs given: the node runs alone on its own time.
"""

from __future__ import annotations

import heapq
from array import array
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, MutableSequence, Sequence
from itertools import compress, count, groupby, islice
from operator import lt, not_
from pathlib import Path
from sys import intern
from typing import Any

import msgspec
from msgspec import field

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.chakra.schema import node_type_name
from etweave.errors import BadInput
from etweave.runfolder import file_rank, lone_file_rank
from etweave.simulate.byrank import Ambiguous, RankByRank
from etweave.simulate.engine import GraphError, node_positions, packed_ints, rank_edges
from etweave.simulate.network import DEFAULT_NETWORK, NETWORK_TIMED, Network, collective_ns, send_ns
from etweave.simulate.pool import load_files
from etweave.simulate.reader import read_nodes

CPU, GPU, COMM, FREE = 0, 1, 2, 3  # the slot a node takes; FREE = none
SLOT_NAMES = ("CPU", "GPU", "comm")
COLLECTIVE_TIMING = ("network", "duration")
_WANTED = frozenset({"kind", "is_cpu_op", "comm_type", "comm_size", "pg_name", "comm_src", "comm_dst", "comm_tag",
                     "measured_duration_micros"})
# engine-internal node kinds
_COMP, _COLL, _BCAST, _SEND, _RECV = 0, 1, 2, 3, 4
_P2P = frozenset({_SEND, _RECV})
_TIMED = frozenset({_COLL, _SEND})  # timed by the network (or their duration): `_EventLoop.comm_ns`
_ALONE, _NEVER = -1, -2  # send/recv peer markers, as in engine.py
# pg_name values of a collective of every NPU given ("" and "0" both mean all NPUs: docs/FACTS.md §A5)
ALL_NPUS_PGS = frozenset({"", "0"})
_NEVER_SCHEDULED = -1  # a node's end time while it has none
# a rank's state in the event loop, one list (`_EventLoop.state`): its ready heaps at [slot] (CPU, GPU, COMM, FREE),
# the node holding each slot at [_HOLD + slot] (-1: none; FREE's unused), ns waited per slot at [_WAIT + slot], the
# rank index at [_RI]. One list, not one per field: an event touches a few cache lines of its rank, and at 1000
# ranks those lines are what falls out of the caches between two events of a rank
_HOLD, _WAIT, _RI = 4, 8, 11


# (array_like: as msgpack, a list of values, not a map: the loading pool's bytes halve and decode faster)
class AstraNode(msgspec.Struct, gc=False, array_like=True):  # numbers, strings, a tuple of ints: never in a cycle
    id: int
    name: str
    type: int  # Chakra NodeType as written (METADATA_NODE included)
    deps: tuple[int, ...]
    duration_us: int
    is_cpu_op: bool
    comm_type: int | None = None
    comm_size: int = 0
    pg: str = ""
    comm_src: int | None = None
    comm_dst: int | None = None
    comm_tag: int | None = None
    measured_start: int = 0  # µs, 0 = not measured
    measured_end: int = 0
    kind: str = ""  # etweave's attr `kind` (delay, host_op, kernel, ...), for the contention breakdown


class AstraRank(msgspec.Struct, array_like=True):
    rank: int  # the NPU it is replayed as
    nodes: list[AstraNode]
    source: str = ""
    replica: bool = False  # one trace replayed as several NPUs: its sends and recvs have no peer among them


class AstraRun(msgspec.Struct):
    ranks: list[AstraRank]
    collectives: str  # "network" or "duration"
    slots: bool
    finished_ns: list[int | None]  # per rank index; None = never finished (stuck nodes)
    slot_wait_ns: list[list[int]]  # per rank index, per slot (CPU, GPU, comm): ready → issue, summed
    # per rank index: ns a slot was held while another node waited for it, by (slot, the holder's kind); empty
    # dicts unless asked for (`contention`)
    blocked_by: list[dict[tuple[int, str], int]] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)  # "rank R node N name: why", at most MAX_STUCK
    stuck_count: int = 0
    notes: list[str] = field(default_factory=list)
    by_rank: bool = False  # replayed rank by rank (`_EventLoop`), else in one global order: the same result
    replicas_replayed: bool = False  # identical replicas: the first replayed, standing for each (`_mirrors`)

    @property
    def makespan_ns(self) -> int:
        return max((f for f in self.finished_ns if f is not None), default=0)


MAX_STUCK = 10


def _as_int(value: object, default: int = 0) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def load_astra_rank(path: Path, default_rank: int | None = None) -> AstraRank:
    """One `.et` file, read the way ASTRA-sim's feeder reads it (only the fields it uses, plus measured times).
    Its rank as `etweave simulate` finds it (`runfolder.file_rank`)."""
    metadata, nodes = read_nodes(path, _WANTED)  # a chunk at a time, only the fields ASTRA-sim's feeder reads
    rank = file_rank(metadata, path, default_rank)
    out: list[AstraNode] = []
    append = out.append
    comm_types = COMM_NODE_TYPES
    for node_id, name, ntype, deps, start, duration, attrs in nodes:
        kind = attrs.get("kind", "")
        measured = attrs.get("measured_duration_micros")
        # names (interned by the reader) and kinds repeat over nodes and ranks: memory per distinct string
        an = AstraNode(node_id, name, ntype, deps, duration, bool(attrs.get("is_cpu_op", True)), None, 0, "",
                       None, None, None, start, start + (duration if measured is None else _as_int(measured, duration)),
                       kind if type(kind) is str else intern(str(kind)))
        if ntype in comm_types:
            an.comm_size = _as_int(attrs.get("comm_size"))
            if "comm_type" in attrs:
                an.comm_type = _as_int(attrs["comm_type"])
            pg = attrs.get("pg_name", "")
            an.pg = pg if isinstance(pg, str) else str(pg)
            for attr in ("comm_src", "comm_dst", "comm_tag"):
                if attr in attrs:
                    setattr(an, attr, _as_int(attrs[attr]))
        append(an)
    return AstraRank(rank=rank, nodes=out, source=str(path))


def intern_strings(rank: AstraRank) -> AstraRank:
    """A rank decoded from msgpack (`etweave.simulate.pool`) with its names, kinds and group names interned again,
    as `load_astra_rank` leaves them: memory per distinct string, not per node (at 1000 ranks, ~0.5 GB)."""
    for nd in rank.nodes:
        nd.name = intern(nd.name)
        nd.kind = intern(nd.kind)
        if nd.pg:
            nd.pg = intern(nd.pg)
    return rank


def measured_span_us(ranks: Sequence[AstraRank]) -> int | None:
    """Earliest measured start to latest measured end over all ranks (as `etweave simulate` reports it)."""
    lo = hi = None
    # each node list once: a lone trace's replicas (`replicate`) share one, and may be thousands of NPUs
    for nodes in {id(rg.nodes): rg.nodes for rg in ranks}.values():  # column by column: this runs over every node
        starts = [nd.measured_start for nd in nodes]
        if any(starts):
            first = min(filter(None, starts))
            last = max(compress([nd.measured_end for nd in nodes], starts))
            lo = first if lo is None else min(lo, first)
            hi = last if hi is None else max(hi, last)
    return None if lo is None or hi is None else hi - lo


def _kind_and_slot(nd: AstraNode, ri: int) -> tuple[int, int]:
    # ASTRA-sim dispatches on the node type first (`HardwareResource`, `Workload::issue`): is_cpu_op only splits
    # COMP nodes between the CPU and the GPU slot
    if nd.type == pb.COMM_COLL_NODE:
        if nd.comm_type == pb.BROADCAST:
            return _BCAST, COMM
        if nd.comm_type not in NETWORK_TIMED:
            raise GraphError(ri, f"collective node {nd.id} has comm_type {nd.comm_type}, which ASTRA-sim does not "
                                 "run (Unsupported collective comm type)")
        return _COLL, COMM
    if nd.type == pb.COMM_SEND_NODE:
        return _SEND, COMM
    if nd.type == pb.COMM_RECV_NODE:
        return _RECV, FREE
    # COMP, METADATA read as COMP (and MEM/INVALID, which etweave never writes): timed from the duration
    return _COMP, CPU if nd.is_cpu_op else GPU


def simulate(ranks: Sequence[AstraRank], groups: Mapping[str, Sequence[int]], network: Network = DEFAULT_NETWORK,
             collectives: str = "network", slots: bool = True, slotless_kinds: Collection[str] = (),
             contention: bool = True) -> AstraRun:
    """Replay `ranks` (one per NPU) under ASTRA-sim's rules; see the module docstring. `slotless_kinds`: nodes
    whose attr `kind` is one of these take no slot (a what-if for the benchmark: e.g. "delay" asks what the
    run would take if waiting nodes did not hold the CPU slot; ASTRA-sim itself has no such rule).
    `contention`: account `AstraRun.blocked_by` (a dict update at every event; `etweave simulate` prints none)."""
    return simulate_timings(ranks, groups, network, (collectives,), slots, slotless_kinds, contention)[0]


def simulate_timings(ranks: Sequence[AstraRank], groups: Mapping[str, Sequence[int]], network: Network,
                     timings: Sequence[str], slots: bool = True, slotless_kinds: Collection[str] = (),
                     contention: bool = True, by_rank: bool = True) -> list[AstraRun]:
    """`simulate` once per collective timing in `timings`, the graphs indexed once for all of the runs.
    `by_rank=False`: replay every event in one global order (`_EventLoop`; the same result, slower at many
    ranks: the reference the tests hold the rank-by-rank replay to)."""
    for collectives in timings:
        if collectives not in COLLECTIVE_TIMING:
            raise ValueError(f"collectives must be one of {COLLECTIVE_TIMING}")
    ranks = list(ranks)
    index_of_rank = {rg.rank: ri for ri, rg in enumerate(ranks)}
    if len(index_of_rank) != len(ranks):
        raise GraphError(None, "a rank is given more than once")
    if by_rank and _mirrors(ranks, groups):
        try:
            return _runs(ranks, ranks[:1], groups, network, timings, slots, slotless_kinds, contention, True)
        except Ambiguous:  # (its own order cannot tell how the replicas' ties fall): every NPU replayed
            pass
    return _runs(ranks, ranks, groups, network, timings, slots, slotless_kinds, contention, by_rank)


def _runs(npus: list[AstraRank], replayed: list[AstraRank], groups: Mapping[str, Sequence[int]], network: Network,
          timings: Sequence[str], slots: bool, slotless_kinds: Collection[str], contention: bool, by_rank: bool
          ) -> list[AstraRun]:
    """One run per timing of the NPUs `npus`, replaying `replayed`: all of them, or the first of identical replicas
    (`_mirrors`) standing for every one."""
    index_of_rank = {rg.rank: ri for ri, rg in enumerate(replayed)}
    flat = _flatten(replayed, slots, slotless_kinds, contention)
    instances = _collective_instances(replayed, flat, groups, index_of_rank)
    peer, alone = _send_recv_peers(replayed, flat, index_of_rank)
    runs: list[AstraRun] = []
    loop = None
    for timing in timings:
        run, loop = _run(npus, replayed, flat, instances, peer, network, timing, slots, alone, contention, loop,
                         by_rank)
        runs.append(run)
    return runs


def _mirrors(ranks: list[AstraRank], groups: Mapping[str, Sequence[int]]) -> bool:
    """The NPUs are replicas of one trace (`replicate`) and every collective's group holds all of them: each
    NPU's replay is then the first's, so that one is replayed alone, standing for all (`_EventLoop.replicas`),
    unless a tie between a collective's end and another event of the NPU could fall either way in the replay of
    every NPU (ASTRA-sim orders equal times by the order scheduled, and the last replica to issue schedules the
    collective's end): that raises `Ambiguous` and every NPU is replayed."""
    first = ranks[0]
    if len(ranks) < 2 or not all(rg.replica and rg.nodes is first.nodes for rg in ranks):
        return False
    everyone = {rg.rank for rg in ranks}
    pgs = {nd.pg for nd in first.nodes if nd.type == pb.COMM_COLL_NODE and nd.comm_type != pb.BROADCAST}
    return all(pg in ALL_NPUS_PGS or everyone <= set(groups.get(pg, ())) for pg in pgs)


def _run(npus: list[AstraRank], ranks: list[AstraRank], flat: _Flat, instances: _Instances, peer: list[int],
         network: Network, collectives: str, slots: bool, alone: int, contention: bool, prior: _EventLoop | None,
         by_rank: bool) -> tuple[AstraRun, _EventLoop]:
    """One run of the NPUs `npus` replaying `ranks` (all of them, or the first replica standing for each:
    its `Ambiguous` is raised), and its event loop (whose columns the next run reuses: `prior`, the one before)."""
    replicas = len(npus) // len(ranks)
    alone *= replicas
    notes = [f"{alone} send/recv nodes have no peer among the NPUs given: replayed alone"] if alone else []
    try:
        loop = _EventLoop(ranks, flat, instances, peer, network, collectives, contention, prior=prior,
                          by_rank=by_rank, replicas=replicas)
        try:
            loop.run()
        except Ambiguous:  # (rank by rank could not tell the global order): again, in one global order
            if replicas > 1:
                raise
            loop = _EventLoop(ranks, flat, instances, peer, network, collectives, contention, prior=loop,
                              by_rank=False)
            loop.run()
    except OverflowError:  # a time past 2^63 ns (durations no real run has): the same run on Python ints
        loop = _EventLoop(ranks, flat, instances, peer, network, collectives, contention, machine_ints=False,
                          by_rank=False, replicas=replicas)
        loop.run()
    n = len(flat.kind)
    finished: list[int | None] = []
    for ri, rg in enumerate(ranks):
        first, last = flat.offset[ri], flat.offset[ri] + len(rg.nodes)
        ends = loop.end[first:last]  # every event scheduled ran: a node is done when it has an end
        finished.append(max(ends, default=0) if min(ends, default=0) >= 0 else None)
    run = AstraRun(ranks=npus, collectives=collectives, slots=slots, finished_ns=finished * replicas,
                   by_rank=loop.by_rank, replicas_replayed=replicas > 1,
                   slot_wait_ns=[st[_WAIT:_WAIT + 3] for _ in range(replicas) for st in loop.state],
                   blocked_by=[dict(b) for _ in range(replicas) for b in loop.blocked], notes=notes)
    # (a rank is unfinished when a node of it never ended: no pass over every node when all finished)
    stuck = list(compress(range(n), map(_NEVER_SCHEDULED.__eq__, loop.end))) if None in finished else []
    run.stuck_count = len(stuck) * replicas
    run.stuck = _stuck_lines(npus, flat, loop, stuck, replicas)
    return run, loop


class _Flat(msgspec.Struct):
    """Every node of every rank at one global index g = offset[rank index] + its place in the rank's id order,
    in parallel columns: g ascends with node id within a rank, so a rank's ready nodes order by g alone (plain
    ints in the heaps, not (id, g) pairs)."""

    offset: list[int]
    kind: list[int]  # _COMP, _COLL, ...
    slot: list[int]  # CPU, GPU, COMM or FREE
    dur_ns: list[int]  # own time: duration_micros × 1000, 0 → 1 ns
    node_id: list[int]
    owner: list[int]  # rank index
    kind_name: list[str]  # attr kind, else the node type's name: the contention breakdown's key (with contention)
    indeg: list[int]
    # per g its children: a tuple each (the event loop runs over them; a flat array's slices and items would be
    # new objects at every event)
    children: list[tuple[int, ...]] = field(default_factory=list)
    file_index: dict[int, list[int]] = field(default_factory=dict)  # rank index -> node index by place, when not
    # in id order already (etweave writes nodes in id order)

    def node(self, ranks: Sequence[AstraRank], g: int) -> AstraNode:
        ri = self.owner[g]
        i = g - self.offset[ri]
        order = self.file_index.get(ri)
        return ranks[ri].nodes[i if order is None else order[i]]


def _flatten(ranks: Sequence[AstraRank], slots: bool, slotless_kinds: Collection[str], contention: bool) -> _Flat:
    offset, n = [], 0
    for rg in ranks:
        offset.append(n)
        n += len(rg.nodes)
    flat = _Flat(offset=offset, kind=[_COMP] * n, slot=[CPU] * n, dur_ns=[0] * n, node_id=[0] * n, owner=[0] * n,
                 kind_name=[""] * n if contention else [], indeg=[0] * n)
    for ri, rg in enumerate(ranks):
        if ri and rg.nodes is ranks[ri - 1].nodes:  # a replica (`replicate`): the rank before's columns again
            _copy_rank(flat, ri - 1, ri, len(rg.nodes))
            continue
        try:
            _flatten_rank(flat, ri, rg, slotless_kinds, contention)
        except GraphError:
            _first_error(ri, rg)  # the error the node-by-node rules meet first
            raise
    if not slots:
        flat.slot = [FREE] * n
    return flat


def _flatten_rank(flat: _Flat, ri: int, rg: AstraRank, slotless_kinds: Collection[str], contention: bool) -> None:
    """Rank `ri`'s part of the flat columns, column by column (this runs for every node of every rank)."""
    nodes, base = rg.nodes, flat.offset[ri]
    end = base + len(nodes)
    ids = [nd.id for nd in nodes]
    if not all(map(lt, ids, islice(ids, 1, None))):  # not in id order: place the nodes in it
        order = sorted(range(len(nodes)), key=ids.__getitem__)
        flat.file_index[ri] = order
        nodes = [nodes[i] for i in order]
        ids = [nd.id for nd in nodes]
    # most nodes are COMP nodes: their kind is _COMP and is_cpu_op picks the slot; the others (picked in C) by
    # _kind_and_slot
    kinds = [_COMP] * len(nodes)
    slots = [CPU if nd.is_cpu_op else GPU for nd in nodes]
    for i in compress(range(len(nodes)), map(pb.COMP_NODE.__ne__, [nd.type for nd in nodes])):
        kinds[i], slots[i] = _kind_and_slot(nodes[i], ri)
    flat.kind[base:end] = kinds
    flat.slot[base:end] = ([FREE if nd.kind in slotless_kinds else s for nd, s in zip(nodes, slots, strict=True)]
                           if slotless_kinds else slots)
    flat.dur_ns[base:end] = [d * 1000 if d > 0 else 1 for d in [nd.duration_us for nd in nodes]]  # max(1, d * 1000)
    flat.node_id[base:end] = ids
    flat.owner[base:end] = [ri] * len(nodes)
    if contention:
        flat.kind_name[base:end] = [nd.kind or node_type_name(nd.type) for nd in nodes]
    flat.children += rank_edges(ri, ids, [nd.deps for nd in nodes], base, flat.indeg)


def _copy_rank(flat: _Flat, src: int, ri: int, count: int) -> None:
    """Rank `ri` holds the very nodes rank `src` does: its columns are src's, its edges moved to its own indices
    (a lone trace replayed as several NPUs indexes its edges once, not once per NPU)."""
    a, b = flat.offset[src], flat.offset[ri]
    columns: tuple[list[Any], ...] = (flat.kind, flat.slot, flat.dur_ns, flat.node_id, flat.indeg, flat.kind_name)
    for column in columns:
        if column:  # (kind_name: with contention only)
            column[b:b + count] = column[a:a + count]
    flat.owner[b:b + count] = [ri] * count
    if src in flat.file_index:
        flat.file_index[ri] = flat.file_index[src]
    step = b - a
    flat.children += [tuple([c + step for c in kids]) if kids else kids for kids in flat.children[a:a + count]]


def _first_error(ri: int, rg: AstraRank) -> None:
    """Raise the GraphError that checking rank `ri` node by node (its ids, then each node's type and deps) meets
    first."""
    ids = node_positions(ri, [nd.id for nd in rg.nodes])
    for nd in rg.nodes:
        _kind_and_slot(nd, ri)
        for d in nd.deps:
            if d not in ids:
                raise GraphError(ri, f"node {nd.id} depends on node {d}, which is not in the file")


class _Instances(msgspec.Struct):
    """Collective instances: the k-th collective of a group on each member rank (ascending id)."""

    of: list[int]  # per global index: its instance, -1 = none
    nodes: list[list[int]] = field(default_factory=list)  # per instance: its nodes among the NPUs given
    size: list[int] = field(default_factory=list)  # per instance: the group's members among the NPUs given


def _collective_instances(ranks: Sequence[AstraRank], flat: _Flat, groups: Mapping[str, Sequence[int]],
                          index_of_rank: Mapping[int, int]) -> _Instances:
    instances = _Instances(of=[-1] * len(flat.kind))
    per_pg: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for g in compress(range(len(flat.kind)), map(_COLL.__eq__, flat.kind)):  # picked in C: a pass over every node
        per_pg[flat.node(ranks, g).pg][flat.owner[g]].append(g)
    for pg, by_rank in sorted(per_pg.items()):
        members = _members(ranks, flat, pg, by_rank, groups, index_of_rank)
        for lst in by_rank.values():
            lst.sort(key=lambda g: flat.node_id[g])
        for k in range(max(len(v) for v in by_rank.values())):
            inst = [by_rank[ri][k] for ri in members if k < len(by_rank.get(ri, []))]
            for g in inst:
                instances.of[g] = len(instances.nodes)
            instances.nodes.append(inst)
            instances.size.append(len(members))
    return instances


def _members(ranks: Sequence[AstraRank], flat: _Flat, pg: str, by_rank: Mapping[int, list[int]],
             groups: Mapping[str, Sequence[int]], index_of_rank: Mapping[int, int]) -> list[int]:
    """The rank indices of group `pg`'s members among the NPUs given; a collective of a group the comm-group map
    does not list, or issued by a rank outside the group, is a GraphError."""
    if pg in ALL_NPUS_PGS:
        return list(range(len(ranks)))
    if pg not in groups:
        ri = min(by_rank)
        raise GraphError(ri, f"collective node {flat.node_id[by_rank[ri][0]]} uses pg_name {pg!r}, which the "
                             "comm-group map does not list")
    members = sorted(index_of_rank[r] for r in groups[pg] if r in index_of_rank)
    outside = [ri for ri in by_rank if ri not in members]
    if outside:
        raise GraphError(outside[0], f"rank {ranks[outside[0]].rank} issues collectives of pg {pg!r}, "
                                     f"whose members are {sorted(groups[pg])}")
    return members


def _send_recv_peers(ranks: Sequence[AstraRank], flat: _Flat,
                     index_of_rank: Mapping[int, int]) -> tuple[list[int], int]:
    """Per global index, the matching send or recv (_ALONE: none among the NPUs given, _NEVER: never issued), and
    how many send/recv nodes have no peer among the NPUs given."""
    peer = [_ALONE] * len(flat.kind)
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for g in compress(range(len(flat.kind)), map(_P2P.__contains__, flat.kind)):  # picked in C
        nd = flat.node(ranks, g)
        if nd.comm_src is None or nd.comm_dst is None or nd.comm_tag is None:
            raise GraphError(flat.owner[g], f"send/recv node {nd.id} lacks comm_src, comm_dst or comm_tag")
        (sends if flat.kind[g] == _SEND else recvs)[(nd.comm_src, nd.comm_dst, nd.comm_tag)].append(g)
    alone = 0
    for table, other_table, peer_side in ((sends, recvs, 1), (recvs, sends, 0)):
        for key, lst in table.items():
            lst.sort(key=lambda g: flat.node_id[g])
            other = sorted(other_table.get(key, []), key=lambda g: flat.node_id[g])
            for k, g in enumerate(lst):
                rg = ranks[flat.owner[g]]
                if rg.replica or key[peer_side] not in index_of_rank or key[1 - peer_side] != rg.rank:
                    alone += 1
                else:
                    peer[g] = other[k] if k < len(other) else _NEVER
    return peer, alone


class _EventLoop(RankByRank):
    """The replay: events complete in time order, equal times in the order they were scheduled; whenever a node
    of a rank finishes, that rank's ready nodes issue as ASTRA-sim issues them.

    An event is one int, ordered as (end time, time scheduled, sequence number, g) (`_key`): a heap of ints
    compares in C, a heap of tuples through a call per element. Events scheduled at a later time, or later at the
    same time, have higher sequence numbers, so over all ranks this is "equal times in the order scheduled", and
    within one rank it is that order too whichever rank scheduled an event: the ranks replay one after another
    (`etweave.simulate.byrank`). Only where two events of a rank end and were scheduled at the same times, one of
    them by another rank (its g carried as g + n), does the global sequence order them: `Ambiguous`.

    `replicas` > 1: each rank replayed stands for that many identical NPUs (`_mirrors`): its collectives' groups
    and the NPU count are that many times the ranks replayed, every member of a collective issues it when this
    one does, and the last of them (another NPU) decides its end, so the end's event is checked as another rank's."""

    def __init__(self, ranks: Sequence[AstraRank], flat: _Flat, instances: _Instances, peer: list[int],
                 network: Network, collectives: str, contention: bool = True, machine_ints: bool = True,
                 prior: _EventLoop | None = None, by_rank: bool = True, replicas: int = 1) -> None:
        n, nranks = len(flat.kind), len(ranks)
        self.replicas = replicas
        self.indeg: list[int]
        if prior is not None:
            prior.indeg.clear()  # (done with: freed before the copy below, not beside it)
        self.indeg = flat.indeg.copy()  # counted down here: the flat columns serve every run
        self.ranks, self.flat, self.instances, self.peer = ranks, flat, instances, peer
        self.network, self.collectives, self.contention = network, collectives, contention
        self.dur_ns: MutableSequence[int]
        self.issue_t: MutableSequence[int]
        self.ready_t: MutableSequence[int]
        self.end: MutableSequence[int]
        self.state: list[list[Any]]
        self.state_of: list[list[Any]]
        if (prior is not None and machine_ints and isinstance(prior.end, array) and prior.flat is flat
                and prior.ranks is ranks):
            # the columns of the run before (done with), reset in place: new ones would be new pages from the OS
            # (~35 MB each at 1000 ranks), and its durations and states per node serve as they are
            self.dur_ns, self.state, self.state_of = prior.dur_ns, prior.state, prior.state_of
            self.issue_t, self.ready_t, self.end = prior.issue_t, prior.ready_t, prior.end
            for column in (self.issue_t, self.ready_t, self.end):
                _fill(column, -1)
            for ri, st in enumerate(self.state):
                st[:] = _new_state(ri)
        else:
            self.dur_ns = packed_ints(flat.dur_ns)  # what the loop reads per node, in place (`packed_ints`)
            # machine ints, not an int object per node and time: memory stays near the graph's at 1000 ranks
            times: Callable[[], MutableSequence[int]] = ((lambda: array("q", [-1]) * n) if machine_ints
                                                         else (lambda: [-1] * n))
            self.issue_t, self.ready_t, self.end = times(), times(), times()  # end: set when scheduled, -1: never
            self.state = [_new_state(ri) for ri in range(nranks)]
            self.state_of = list(map(self.state.__getitem__, flat.owner))  # per g: its rank's state, one lookup
        self.arrived = [0] * len(instances.nodes)
        self.latest = [-1] * len(instances.nodes)  # per instance: the latest issue among its members so far
        self.at_latest = [0] * len(instances.nodes)  # how many members issued it at that time
        self.since = [[0] * 3 for _ in ranks]  # when each slot's (holder, someone waiting) state was last accounted
        self.blocked: list[dict[tuple[int, str], int]] = [defaultdict(int) for _ in ranks]  # with contention
        self.comm_ns = self._comm_times()
        # key layout (`_key`): g (or g + n: scheduled by another rank's event), sequence number, the longest any
        # event lasts less its length (later scheduled, higher), end time
        self.n = n
        self.seq = count(1)  # each event's place in the order of scheduling: one per node at most
        self.g_bits = max(2 * n, 1).bit_length()
        self.p_shift = self.g_bits + (2 * n + 2).bit_length()
        self.longest = max(max(self.dur_ns, default=0), max(self.comm_ns.values(), default=0))
        self.time_shift = self.p_shift + self.longest.bit_length()
        self.tie_shift = self.p_shift
        self._init_ranks(nranks, n, by_rank)
        self.last_key = [-1] * nranks  # per rank: the key of the last event it replayed
        self.now = 0  # the time of the event being replayed

    def _comm_times(self) -> dict[int, int]:
        """ns each collective (once its last member issued it) and each send (from its issue) takes."""
        flat, times = self.flat, {}
        timed = compress(range(len(flat.kind)), map(_TIMED.__contains__, flat.kind))  # picked in C
        if self.collectives == "duration":
            return {g: flat.dur_ns[g] for g in timed}
        for g in timed:
            nd = flat.node(self.ranks, g)
            times[g] = (collective_ns(self.network, nd.comm_type or 0, nd.comm_size,
                                      self.instances.size[self.instances.of[g]] * self.replicas)
                        if flat.kind[g] == _COLL else
                        send_ns(self.network, nd.comm_size, nd.comm_src or 0, nd.comm_dst or 0,
                                len(self.ranks) * self.replicas))
        return times

    def _key(self, t: int, p: int, g: int) -> int:
        """The event of node g ending at t, scheduled at time p (g + n: by another rank's event)."""
        return (t << self.time_shift) | ((self.longest - (t - p)) << self.p_shift) | (next(self.seq) << self.g_bits) | g

    def run(self) -> None:
        for g in compress(range(len(self.indeg)), map(not_, self.indeg)):  # the roots, picked in C
            self.make_ready(g, 0)
        for ri in range(len(self.ranks)):
            self.cur = ri
            self.issue_ready(ri, 0)
        self.replay_all()
        if next(self.seq) >> (self.p_shift - self.g_bits):
            raise AssertionError("more events than the packed sequence numbers hold")

    def _earliest_end(self, g: int) -> int:
        """The earliest a pending comm node g could end: a collective once its last member issued it (at or after
        the latest issue so far and `gvt`), a recv once its send did."""
        if self.flat.kind[g] == _COLL:
            inst = self.instances.of[g]
            return max(self.latest[inst], self.gvt) + self.comm_ns[g]
        s = self.peer[g]
        if self.collectives == "network":
            return max(self.issue_t[g], self.gvt + self.comm_ns[s])
        return max(self.issue_t[g] + self.dur_ns[g], self.gvt + self.dur_ns[s])

    def _check_place(self, key: int, prev: int, events: list[int]) -> None:
        """An event another rank scheduled: if an event of this rank just before or after it ends and was
        scheduled at the same times, the global order's sequence orders them, not this rank's."""
        when = key >> self.p_shift
        if prev >> self.p_shift == when or (events and events[0] >> self.p_shift == when):
            raise Ambiguous

    def _replay(self, ri: int) -> None:  # noqa: C901 (the per-event loop, its common case inline: measured)
        """Every event of rank ri's heap below its horizon, in order (with by_rank off, every event: one heap,
        no horizon). `issue_ready` and `make_ready` written out, and `issue` of a compute node: they run per
        node."""
        flat = self.flat
        indeg, children, slot, state_of, dur_ns = self.indeg, flat.children, flat.slot, self.state_of, self.dur_ns
        events, ready_t, end, horizon = self.heaps[ri], self.ready_t, self.end, self.horizon
        pop, push, issue_ready, tick = heapq.heappop, heapq.heappush, self.issue_ready, self.seq.__next__
        charge = self._charge if self.contention else None
        shift, p_shift, g_bits, g_mask = self.time_shift, self.p_shift, self.g_bits, (1 << self.g_bits) - 1
        longest, n = self.longest, self.n
        below, prev = horizon[ri], self.last_key[ri]
        while events and events[0] < below:
            key = pop(events)
            t, g = key >> shift, key & g_mask
            if g >= n:  # scheduled by another rank's event
                g -= n
                self._check_place(key, prev, events)
            prev = key
            st = state_of[g]
            if charge is not None:
                charge(st[_RI], t)
            st[_HOLD + slot[g]] = -1  # (a FREE node's holder entry is one nothing reads)
            for c in children[g]:
                d = indeg[c] - 1
                indeg[c] = d
                if not d:
                    ready_t[c] = t
                    push(st[slot[c]], c)
            # the nodes that issue now (`_pick`'s rule): most events issue one compute node, the lowest ready one
            # of the only free slot that has some, taken here without a call or a list; a comm slot's node (never
            # a compute node) counts as two, so it takes the general way
            cpu, gpu, comm, free, h_cpu, h_gpu, h_comm, _, _, _, _, rank = st
            k = 0
            if cpu and h_cpu < 0:
                h, k = cpu, 1
            if gpu and h_gpu < 0:
                h, k = gpu, k + 1
            if comm and h_comm < 0:
                k += 2
            if k != 1 or free:
                if k or free:
                    self.now = t
                    issue_ready(rank, t)
                    below = horizon[ri]  # a comm node it issued may wait for another rank
                continue
            c = pop(h)  # a compute node: CPU and GPU slots hold nothing else. (Its issue time is not kept: only a
            # send's or recv's is read, and a compute node that issued always ends.)
            s = slot[c]
            st[_HOLD + s] = c
            st[_WAIT + s] += t - ready_t[c]
            d = dur_ns[c]
            end[c] = e = t + d
            push(events, (e << shift) | ((longest - d) << p_shift) | (tick() << g_bits) | c)
        self.last_key[ri] = prev

    def _charge(self, ri: int, t: int) -> None:
        """The contention breakdown at an event of rank `ri` at t (the rank's slot states change only at its own
        events): charge each slot's holder, up to t, for the time a node waited for it."""
        st, at, blocked = self.state[ri], self.since[ri], self.blocked[ri]
        kind_name = self.flat.kind_name
        h = st[_HOLD + CPU]  # (unrolled over the three slots)
        if h >= 0 and st[CPU]:
            blocked[CPU, kind_name[h]] += t - at[CPU]
        h = st[_HOLD + GPU]
        if h >= 0 and st[GPU]:
            blocked[GPU, kind_name[h]] += t - at[GPU]
        h = st[_HOLD + COMM]
        if h >= 0 and st[COMM]:
            blocked[COMM, kind_name[h]] += t - at[COMM]
        at[CPU] = at[GPU] = at[COMM] = t

    def finish_at(self, g: int, t: int) -> None:
        """Node g, of the rank being replayed, ends at t: scheduled now."""
        self.end[g] = t
        heapq.heappush(self.heaps[self.flat.owner[g]], self._key(t, self.now, g))

    def _end_decided(self, g: int, t: int, p: int, certain: bool) -> None:
        """Comm node g ends at t, as decided at time p, when its collective's last member or the later of its
        send and recv issued. `certain`: g is of the rank being replayed, which decided it now, after every
        event the global order has before (else its event carries g + n, `_replay` checks its place, and this
        checks that its rank has not replayed past it)."""
        q = self.flat.owner[g]
        if certain or not (self.by_rank or self.replicas > 1):
            self.end[g] = t
            heapq.heappush(self.heaps[q], self._key(t, p, g))
            return
        key = self._key(t, p, g + self.n)
        if q != self.cur and key >> self.p_shift <= self.last_key[q] >> self.p_shift:
            raise Ambiguous
        self.end[g] = t
        heapq.heappush(self.heaps[q], key)
        self.decided(q, g)

    def recv_done(self, r: int, s: int, now: int) -> None:
        """Recv r and its send s both issued (`now` of them just now): r ends when the message arrived."""
        issue_t, dur_ns, owner = self.issue_t, self.flat.dur_ns, self.flat.owner
        tr, ts = issue_t[r], issue_t[s]
        end = max(tr, ts + self.comm_ns[s]) if self.collectives == "network" else max(tr + dur_ns[r], ts + dur_ns[s])
        other = s if now == r else r
        self._end_decided(r, end, max(tr, ts), self.recv_decided_here(owner[r], owner[other], issue_t[now],
                                                                      issue_t[other]))

    def issue(self, g: int, t: int) -> None:
        flat = self.flat
        self.issue_t[g] = t
        s = flat.slot[g]
        if s != FREE:
            st = self.state[flat.owner[g]]
            st[_HOLD + s] = g
            st[_WAIT + s] += t - self.ready_t[g]
        k = flat.kind[g]
        if k in (_COMP, _BCAST):
            self.finish_at(g, t + flat.dur_ns[g])
        elif k == _COLL:
            self.arrive(g, t)
        elif k == _SEND:
            self.finish_at(g, t + self.comm_ns[g])
            r = self.peer[g]
            if r >= 0 and self.issue_t[r] >= 0:
                self.recv_done(r, g, g)
        else:  # recv
            s2 = self.peer[g]
            if s2 == _ALONE:
                self.finish_at(g, t + flat.dur_ns[g])
            elif s2 >= 0:
                if self.issue_t[s2] >= 0:
                    self.recv_done(g, s2, g)
                else:
                    self.wait_elsewhere(g)

    def arrive(self, g: int, t: int) -> None:
        """Collective g issued at t: its instance starts when its last member issued it (the latest issue)."""
        inst = self.instances.of[g]
        self.arrived[inst] += 1
        if t > self.latest[inst]:
            self.latest[inst], self.at_latest[inst] = t, 1
        elif t == self.latest[inst]:
            self.at_latest[inst] += 1
        if self.arrived[inst] < self.instances.size[inst]:
            self.wait_elsewhere(g)
            return
        last, owner = self.latest[inst], self.flat.owner
        # the global order decides it at `last`, when the last member issues: this rank, if it alone issued then
        certain = t == last and self.at_latest[inst] == 1 and self.replicas == 1
        for m in self.instances.nodes[inst]:
            self._end_decided(m, last + self.comm_ns[m], last, certain and owner[m] == self.cur)

    def issue_ready(self, ri: int, t: int) -> None:
        for g in _pick(self.state[ri]):
            self.issue(g, t)

    def make_ready(self, g: int, t: int) -> None:
        self.ready_t[g] = t
        heapq.heappush(self.state_of[g][self.flat.slot[g]], g)


def _new_state(ri: int) -> list[Any]:
    """Rank index `ri`'s state before a run (see _HOLD): ready heaps of g per slot, slot holders, ready → issue ns
    summed per slot, ri."""
    return [[], [], [], [], -1, -1, -1, -1, 0, 0, 0, ri]


def _fill(column: MutableSequence[int], value: int) -> None:
    """Every item of an array set to `value`, in place (copied onto itself in doubling runs: no temporary)."""
    view = memoryview(column)  # type: ignore[arg-type]  # an array: the loop's machine-int columns
    size = len(view)
    if size:
        column[0] = value
    done = 1
    while done < size:
        step = min(done, size - done)
        view[done:done + step] = view[:step]
        done += step


_heappop = heapq.heappop  # a module global: `_pick` calls it at every event


def _pick(st: list[Any]) -> list[int]:
    """The ready nodes of a rank that issue now, in id order (g ascends with id within a rank). ASTRA-sim visits
    the ready nodes in ascending id and issues each whose slot is free: per slot that is its lowest ready node;
    every slot-free node issues (issued in id order, which orders equal-time events). `st`: the rank's state
    (`_HOLD`)."""
    cpu, gpu, comm, free, h_cpu, h_gpu, h_comm, _, _, _, _, _ = st  # (one unpacking, not a subscript per test)
    picked = []
    if cpu and h_cpu < 0:
        picked.append(_heappop(cpu))
    if gpu and h_gpu < 0:
        picked.append(_heappop(gpu))
    if comm and h_comm < 0:
        picked.append(_heappop(comm))
    if free:
        picked += free
        free.clear()
        picked.sort()
    elif len(picked) > 1:
        picked.sort()
    return picked


def _stuck_lines(npus: Sequence[AstraRank], flat: _Flat, loop: _EventLoop, stuck: list[int], replicas: int = 1
                 ) -> list[str]:
    """"rank R node N name: why" for the first MAX_STUCK nodes that never finished: issued first, then ready.
    `replicas` > 1: `flat` holds the first of `npus` only, its nodes stuck on each NPU."""
    lines = []
    issue_t, ready_t = loop.issue_t, loop.ready_t

    def state(g: int) -> tuple[bool, bool]:
        return issue_t[g] < 0, ready_t[g] < 0

    ordered = sorted(stuck, key=lambda g: (*state(g), flat.owner[g], flat.node_id[g]))
    places = [(flat.owner[g], g) for g in ordered[:MAX_STUCK]]  # (the NPU's index, the node)
    if replicas > 1:  # the first NPU's nodes stuck on every NPU: per state, each NPU's in turn (not a list of all)
        places = []
        for _, same in groupby(ordered, key=state):
            nodes = list(same)
            for r in range(replicas):
                places += [(r, g) for g in nodes[:MAX_STUCK - len(places)]]
                if len(places) == MAX_STUCK:
                    break
            if len(places) == MAX_STUCK:
                break
    for ri, g in places:
        why = ("issued, waits for its peers" if issue_t[g] >= 0 else
               f"ready, waits for the {SLOT_NAMES[flat.slot[g]]} slot" if ready_t[g] >= 0 else "waits for its deps")
        lines.append(f"rank {npus[ri].rank} node {flat.node_id[g]} {flat.node(npus, g).name!r}: {why}")
    return lines


def replicate(rank: AstraRank, npus: int) -> list[AstraRank]:
    """One rank's trace replayed as `npus` NPUs (ASTRA-sim refuses one NPU: docs/FACTS.md §A7)."""
    return [AstraRank(rank=r, nodes=rank.nodes, source=rank.source, replica=True) for r in range(npus)]


def load_for_astra(files: Sequence[Path], npus: int | None = None, jobs: int = 1) -> list[AstraRank]:
    """The NPUs to replay: one per file, or a single file replayed as `npus` NPUs (default 2: ASTRA-sim refuses 1);
    with `jobs` > 1, read by this process and `jobs` - 1 workers side by side (`etweave.simulate.pool`)."""
    loaded = load_files(files, load_astra_rank, AstraRank, intern_strings, lone_file_rank(files), jobs)
    if len(loaded) == 1:
        return replicate(loaded[0], 2 if npus is None else npus)
    if npus is not None and npus != len(loaded):
        raise BadInput(files[0], f"--npus {npus}: only a single trace can be replayed as several NPUs "
                                 f"({len(loaded)} given)")
    return loaded
