"""Event-driven replay of one or more ranks' Chakra graphs.

Plain data in, plain data out: `replay(ranks, groups) -> Replay`. Time is integer µs and advances from one
completion event to the next (a heap), so the cost is O(E log N) whatever the durations are.

Rules (what `etweave simulate` documents):
- A node is *ready* when all of its deps (data and ctrl) are done. It is *issued* when it is ready and its
  resource is free; it holds the resource from issue until it ends. Nodes without a resource are issued as
  soon as they are ready (unlimited concurrency).
- Several ready nodes waiting for one resource: the one that became ready first is issued first; ties go to
  the lowest node id.
- A collective is issued on each member rank as above, then waits (holding its resource, as an NCCL kernel
  holds its stream) until every member among the ranks given has issued it; all start together at the last
  arrival and each ends start + its own duration. The k-th collective of a group on one rank (ascending id
  among that rank's collectives of that group) matches the k-th on every other member (`etweave.matching`).
- Send/recv: the k-th send from rank S to rank D with tag T matches the k-th recv on D from S with tag T
  (ascending id; `etweave.matching`). A send is eager: it runs its own duration and never waits for the receiver.
  A recv starts when issued and ends at max(its start + its duration, the matching send's start + the send's
  duration). A node whose peer rank is not among the ranks given runs on its own duration.

`replay` runs three stages: indexing (`_index`, `_match_collectives`, `_match_messages`: every rank's nodes as flat
int arrays under one global index, comm nodes matched across ranks), the event loop (`_EventLoop`, over those
integer indices only; the ranks replayed one after another, each up to where it waits for another, with what one
global time order gives: `etweave.simulate.byrank`) and the results (`_critical_path`, or `_Diagnosis`: what each
node that never ended waits for).
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, MutableSequence, Sequence
from itertools import compress, count, groupby, repeat
from operator import lt, not_
from typing import NoReturn

import msgspec
from msgspec import field

from etweave.chakra import et_def_pb2 as pb
from etweave.matching import Channel, collective_instances, group_members, issue_order, match_p2p
from etweave.simulate.byrank import Ambiguous, RankByRank

COLL, SEND, RECV = pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE

# engine-internal kinds, kept as small ints so the hot loop compares ints
_PLAIN, _COLL, _SEND, _RECV = 0, 1, 2, 3
_KIND: dict[int, int] = {COLL: _COLL, SEND: _SEND, RECV: _RECV}

# peer markers for send/recv
_ALONE = -1  # peer rank not among the ranks given: run alone
_NEVER = -2  # peer rank given, but it has no matching node: a recv waits forever


# (array_like: as msgpack, a list of values, not a map: simulate's loading pool's bytes halve and decode faster)
class SimNode(msgspec.Struct, gc=False, array_like=True):  # numbers, strings, a tuple of ints: never in a cycle
    """One node, reduced to what the replay needs. `duration` is the simulated duration (µs)."""

    id: int
    name: str
    type: int  # Chakra NodeType value
    deps: tuple[int, ...] = ()
    duration: int = 0
    resource: str | None = None  # e.g. "gpu0:stream7", "cpu:tid123"; None = takes no resource
    measured_start: int = 0  # µs, 0 = not measured
    measured_duration: int = 0
    pg: str | None = None  # collectives: group name, "" = all ranks given
    comm_src: int | None = None
    comm_dst: int | None = None
    comm_tag: int | None = None
    kind: str = ""  # attr `kind` (host_op, self_part, kernel, delay, ...): what-if selection and step bounds
    part_of: int = 0  # attr `part_of`: the op a self_part/resume node belongs to, 0 = none


class RankGraph(msgspec.Struct, array_like=True):
    rank: int
    nodes: list[SimNode]
    source: str = ""  # file it came from, for messages


class CollInstance(msgspec.Struct):
    """The k-th collective of group `pg`: its nodes as (rank index, node index), on the ranks that issue it."""

    pg: str
    seq: int
    members: list[int]  # global ranks among those given that belong to the group
    nodes: list[tuple[int, int]]


class Stuck(msgspec.Struct):
    rank: int  # global rank
    node_id: int
    name: str
    waits_for: str


class Replay(msgspec.Struct):
    ranks: list[RankGraph]
    # per rank index, per node index; -1 where the node never got there (deadlock)
    issue: list[list[int]]
    start: list[list[int]]
    end: list[list[int]]
    makespan: int
    critical_path: list[tuple[int, int]]  # (rank index, node index), earliest first
    contribution: list[int]  # µs each critical-path node adds to the path; sums to makespan
    collectives: list[CollInstance]
    stuck_count: int = 0
    stuck: list[Stuck] = field(default_factory=list)  # at most MAX_STUCK, root causes first
    notes: list[str] = field(default_factory=list)
    by_rank: bool = False  # replayed rank by rank (`etweave.simulate.byrank`), else in one global order: the same

    def __repr__(self) -> str:  # the default would print every node's times
        stuck = f", {self.stuck_count} stuck" if self.stuck_count else ""
        return (f"Replay({len(self.ranks)} rank(s), {sum(len(rg.nodes) for rg in self.ranks)} nodes, makespan "
                f"{self.makespan} us, critical path {len(self.critical_path)} nodes{stuck})")


class GraphError(ValueError):
    """The graphs (or the group map) are inconsistent; `rank_index` names the offending rank, if one."""

    def __init__(self, rank_index: int | None, problem: str) -> None:
        super().__init__(problem)
        self.rank_index = rank_index
        self.problem = problem


def rank_edges(ri: int, ids: Sequence[int], deps: Iterable[tuple[int, ...]], base: int,
               indeg: MutableSequence[int]) -> list[tuple[int, ...]]:
    """A rank's dependency edges grouped by source: per node index of the rank (file order), the global indices
    (base + node index) of its children, ascending, as a tuple (half a list's memory; a leaf's is the one empty
    tuple); `indeg[g]` set to each node's count of distinct parents. A
    repeated dep is one edge; a missing one is a GraphError. The one rule both replays (this engine and the
    astra-sim model) index a rank's edges by; one call per rank, the usual node of one dep written out (this runs
    for every node)."""
    get = node_positions(ri, ids).get
    children: list[list[int]] = [[] for _ in ids]
    for g, node_deps in enumerate(deps, base):
        if not node_deps:
            continue
        if len(node_deps) == 1:
            p = get(node_deps[0])
            if p is None:
                _raise_missing(ri, ids[g - base], node_deps[0])
            children[p].append(g)
            indeg[g] = 1
            continue
        parents = set(node_deps)
        for d in parents:
            p = get(d)
            if p is None:
                _raise_missing(ri, ids[g - base], d)
            children[p].append(g)
        indeg[g] = len(parents)
    return list(map(tuple, children))


def node_positions(ri: int, ids: Sequence[int]) -> dict[int, int]:
    """Node id -> its index in `ids` (one rank's); a repeated id is a GraphError naming the first to repeat."""
    pos = dict(zip(ids, range(len(ids)), strict=True))
    if len(pos) != len(ids):
        seen: set[int] = set()
        for node_id in ids:
            if node_id in seen:
                raise GraphError(ri, f"node id {node_id} appears twice")
            seen.add(node_id)
    return pos


def _raise_missing(ri: int, node_id: int, dep: int) -> NoReturn:
    raise GraphError(ri, f"node {node_id} depends on node {dep}, which is not in the file")


class UnknownGroup(GraphError):
    """A collective names a pg that the group map does not list."""


MAX_STUCK = 20

_push, _pop = heapq.heappush, heapq.heappop  # module globals: the event loop calls them per node


def replay(ranks: Sequence[RankGraph], groups: Mapping[str, Sequence[int]], by_rank: bool = True) -> Replay:
    """Replay `ranks` together. `groups` maps a pg name to its global ranks ("" needs no entry: all ranks).
    `by_rank=False`: every event in one global order (the same result, slower at many ranks: the reference the
    tests hold the rank-by-rank replay to, `etweave.simulate.byrank`)."""
    graph = _index(list(ranks))
    notes: list[str] = []
    colls = _match_collectives(graph, groups, notes)
    messages = _match_messages(graph, notes)
    loop = _EventLoop(graph, colls, messages, by_rank)
    try:
        loop.run()
    except Ambiguous:  # (rank by rank could not tell the global order): again, in one global order
        loop = _EventLoop(graph, colls, messages, by_rank=False)
        loop.run()
    out = Replay(ranks=graph.ranks, issue=graph.per_rank(loop.issue_t), start=graph.per_rank(loop.start),
                 end=graph.per_rank(loop.end), makespan=max(loop.end, default=0), critical_path=[], contribution=[],
                 collectives=colls.instances, notes=notes, by_rank=loop.by_rank)
    diagnosis = _Diagnosis(graph, colls, messages, loop)
    if diagnosis.stuck:
        out.stuck_count = len(diagnosis.stuck)
        out.stuck = diagnosis.root_causes_first(MAX_STUCK)
        return out
    path, out.contribution = _critical_path(loop.start, loop.end, loop.pred)
    out.critical_path = [graph.locate(g) for g in path]
    return out


# --- indexing: the ranks' nodes as flat arrays over one global index, and the comm nodes matched across ranks


class _Graph(msgspec.Struct):
    """Every rank's nodes under one global index g = offset[rank index] + node index, as flat int columns (the
    event loop compares and indexes plain ints). Dependency edges are grouped by their source: the children of g
    are children[g], a tuple each (the event loop runs over them at every completion: slices and items of one flat
    array would be new objects each time, which cost more than the tuples' memory, ~50 B a node)."""

    ranks: list[RankGraph]
    rank_of: list[int]  # rank index -> global rank
    index_of_rank: dict[int, int]  # global rank -> rank index
    offset: list[int]  # rank index -> global index of its first node
    dur: list[int]
    kind: list[int]  # _PLAIN, _COLL, _SEND, _RECV
    res: list[int]  # resource index, -1 = takes no resource
    node_id: list[int]
    indeg: list[int]
    res_names: list[tuple[int, str]]  # resource index -> (rank index, label)
    children: list[tuple[int, ...]] = field(default_factory=list)

    def rank_index(self, g: int) -> int:
        """The rank of global index g: the last one whose offset is <= g (a rank with no nodes shares its
        offset with the next)."""
        return bisect_right(self.offset, g) - 1

    def locate(self, g: int) -> tuple[int, int]:
        """(rank index, node index) of global index g."""
        ri = self.rank_index(g)
        return ri, g - self.offset[ri]

    def per_rank(self, values: list[int]) -> list[list[int]]:
        """A flat per-node list cut into one list per rank."""
        return [values[self.offset[ri]: self.offset[ri] + len(rg.nodes)] for ri, rg in enumerate(self.ranks)]


def _index(ranks: list[RankGraph]) -> _Graph:
    index_of_rank: dict[int, int] = {}
    for ri, rg in enumerate(ranks):
        if rg.rank in index_of_rank:
            other = ranks[index_of_rank[rg.rank]].source or f"graph #{index_of_rank[rg.rank]}"
            raise GraphError(ri, f"rank {rg.rank} given more than once (also {other})")
        index_of_rank[rg.rank] = ri
    offset: list[int] = []
    n = 0
    for rg in ranks:
        offset.append(n)
        n += len(rg.nodes)
    graph = _Graph(ranks, [rg.rank for rg in ranks], index_of_rank, offset, dur=[0] * n, kind=[_PLAIN] * n,
                   res=[-1] * n, node_id=[0] * n, indeg=[0] * n, res_names=[])
    for ri, rg in enumerate(ranks):
        _index_rank(graph, ri, rg)
    return graph


def _index_rank(graph: _Graph, ri: int, rg: RankGraph) -> None:
    """Fill rank `ri`'s part of the flat arrays, its dependency edges grouped by source included. Column by
    column (comprehensions): this runs for every node of every rank."""
    nodes, base = rg.nodes, graph.offset[ri]
    end = base + len(nodes)
    ids = [nd.id for nd in nodes]
    graph.dur[base:end] = [nd.duration for nd in nodes]
    graph.kind[base:end] = map(_KIND.get, [nd.type for nd in nodes], repeat(_PLAIN))
    graph.node_id[base:end] = ids
    graph.res[base:end] = _resource_indices(graph, ri, [nd.resource for nd in nodes])
    graph.children += rank_edges(ri, ids, [nd.deps for nd in nodes], base, graph.indeg)


def _resource_indices(graph: _Graph, ri: int, labels: list[str | None]) -> list[int]:
    """Each node's resource index (-1: none); a rank's labels are numbered in the order of their first use."""
    index: dict[str | None, int] = {None: -1}
    for label in dict.fromkeys(labels):
        if label is not None:
            index[label] = len(graph.res_names)
            graph.res_names.append((ri, label))
    return list(map(index.__getitem__, labels))


class _Collectives(msgspec.Struct):
    """The collective instances (etweave.matching's rule) and, per node, the one it belongs to."""

    instance_of: list[int]  # g -> instance index, -1 = not a collective
    instances: list[CollInstance]
    expected: list[int]  # instance index -> how many members must issue it before it starts
    count: dict[tuple[str, int], int]  # (pg, rank index) -> its collectives of that pg, for messages


def _match_collectives(graph: _Graph, groups: Mapping[str, Sequence[int]], notes: list[str]) -> _Collectives:
    # pg -> rank index -> its collectives of that pg as (node id, node index)
    per_pg: dict[str, dict[int, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for g in _comm_nodes(graph):
        if graph.kind[g] == _COLL:
            ri, i = graph.locate(g)
            nd = graph.ranks[ri].nodes[i]
            per_pg[nd.pg or ""][ri].append((nd.id, i))
    colls = _Collectives([-1] * len(graph.dur), [], [],
                         {(pg, ri): len(lst) for pg, by_rank in per_pg.items() for ri, lst in by_rank.items()})
    for pg, by_rank in sorted(per_pg.items()):
        members = _members(graph, pg, by_rank, groups, notes)
        sequences = {graph.rank_of[ri]: issue_order(lst) for ri, lst in by_rank.items()}
        for k, at in enumerate(collective_instances(sequences, members)):
            nodes = [(graph.index_of_rank[r], item[1]) for r, item in zip(members, at, strict=True)
                     if item is not None]
            for ri, i in nodes:
                colls.instance_of[graph.offset[ri] + i] = len(colls.instances)
            colls.instances.append(CollInstance(pg, k, members, nodes))
            colls.expected.append(len(members))
    return colls


def _members(graph: _Graph, pg: str, by_rank: Mapping[int, list[tuple[int, int]]],
             groups: Mapping[str, Sequence[int]], notes: list[str]) -> list[int]:
    """The given members of `pg`; a group the map lacks, or a rank outside its group, is an error."""
    given = graph.index_of_rank  # looked up, not copied: a set of every rank per group grows as groups x ranks
    members = group_members(pg, given, groups)
    if members is None:
        ri = min(by_rank)
        first_id = by_rank[ri][0][0]  # the rank's first collective of the group in file order
        raise UnknownGroup(ri, f"collective node {first_id} uses pg_name {pg!r}, "
                               "which the comm-group map does not list")
    if pg == "":
        return members
    listed = {int(r) for r in groups[pg]}
    for ri in by_rank:
        if graph.rank_of[ri] not in listed:
            raise GraphError(ri, f"rank {graph.rank_of[ri]} issues collectives of pg {pg!r}, "
                                 f"whose members are {sorted(listed)}")
    missing = [r for r in sorted(listed) if r not in given]
    if missing:
        notes.append(f"pg {pg!r}: members {missing} are not among the files given: ignored")
    return members


class _Messages(msgspec.Struct):
    """Send/recv matched (etweave.matching's rule): per node its peer, or _ALONE / _NEVER."""

    peer: list[int]
    recv_channel: dict[int, tuple[int, int, int, int]]  # recv g -> (src, dst, tag, k: its place on the channel)
    send_count: dict[Channel, int]  # channel -> its sends, for messages


def _match_messages(graph: _Graph, notes: list[str]) -> _Messages:
    sends, recvs = _by_channel(graph)
    messages = _Messages([_ALONE] * len(graph.dur), {}, {ch: len(lst) for ch, lst in sends.items()})
    peer = messages.peer
    alone = unmatched_sends = 0
    for match in match_p2p(sends, recvs, graph.index_of_rank):
        for k, (_, g) in enumerate(match.recvs):
            messages.recv_channel[g] = (*match.channel, k)
        if not match.matchable:
            alone += len(match.sends) + len(match.recvs)
            continue
        for (_, s), (_, r) in match.pairs:
            peer[s], peer[r] = r, s
        for _, g in match.unmatched_sends + match.unmatched_recvs:
            peer[g] = _NEVER
        unmatched_sends += len(match.unmatched_sends)
    if alone:
        notes.append(f"{alone} send/recv nodes have their peer rank outside the files given: replayed alone")
    if unmatched_sends:
        notes.append(f"{unmatched_sends} sends have no matching recv on their (given) peer rank")
    return messages


def _by_channel(graph: _Graph) -> tuple[dict[Channel, list[tuple[int, int]]], dict[Channel, list[tuple[int, int]]]]:
    """(sends, recvs): channel -> its nodes as (node id, g)."""
    sends: dict[Channel, list[tuple[int, int]]] = defaultdict(list)
    recvs: dict[Channel, list[tuple[int, int]]] = defaultdict(list)
    for g in _comm_nodes(graph):
        if graph.kind[g] != _COLL:
            ri, i = graph.locate(g)
            nd = graph.ranks[ri].nodes[i]
            (sends if nd.type == SEND else recvs)[_channel(nd, ri, graph.rank_of[ri])].append((nd.id, g))
    return sends, recvs


def _comm_nodes(graph: _Graph) -> Iterator[int]:
    """The global indices of the comm nodes (collectives, sends, recvs), ascending: picked in C from the kind
    column, not by a Python step per node."""
    return compress(range(len(graph.kind)), graph.kind)  # every kind but _PLAIN is non-zero


def _channel(nd: SimNode, ri: int, rank: int) -> Channel:
    """The channel of a send or recv of rank index `ri` (global rank `rank`), checked against its file."""
    if nd.comm_src is None or nd.comm_dst is None or nd.comm_tag is None:
        raise GraphError(ri, f"{'send' if nd.type == SEND else 'recv'} node {nd.id} lacks "
                             "comm_src, comm_dst or comm_tag")
    own = nd.comm_src if nd.type == SEND else nd.comm_dst
    if own != rank:
        side = "comm_src" if nd.type == SEND else "comm_dst"
        raise GraphError(ri, f"node {nd.id} has {side} {own} but the file is rank {rank}")
    return nd.comm_src, nd.comm_dst, nd.comm_tag


# --- the event loop


class _EventLoop(RankByRank):
    """Time advances from one completion to the next (a heap of (end time, g) per rank: `etweave.simulate.byrank`).
    Per node: when it became ready and why, when it was issued, started and ended, and `pred`, what determined its
    timing (the critical path walks it back); per resource: its holder and a queue of ready nodes (ready time, node
    id, g). At each time every completion is taken before any node issues (drain, then `_dispatch`: a round); a node
    that issues with a zero duration ends at that time, in the next round.

    The ranks replay one after another: an event's place is its (end time, g), so an event another rank decides
    (a collective's start, a recv's message) is in its rank's heap before that rank reaches its time, unless it
    ends at the very time it was decided (a comm node of zero duration: `Ambiguous`). Where several members issue
    a collective at its latest time, the cause of the one the global order issues last is its members' `pred`:
    the order of (round at that time, drain before dispatch, rank, place within the rank), `_arrive`."""

    def __init__(self, graph: _Graph, colls: _Collectives, messages: _Messages, by_rank: bool = True) -> None:
        n, resources = len(graph.dur), len(graph.res_names)
        # durations and ids as machine ints: read in place, not through a pointer to an int object made while
        # loading (those lie spread over each rank's memory)
        self.dur, self.kind, self.res, self.node_id = (packed_ints(graph.dur), graph.kind, graph.res,
                                                       packed_ints(graph.node_id))
        # counted down here (a copy where this order may have to start again in the global one)
        self.indeg = graph.indeg.copy() if by_rank and len(graph.ranks) > 1 else graph.indeg
        self.children, self.graph = graph.children, graph
        self.offset = graph.offset
        self.peer = messages.peer
        self.instance_of, self.instances, self.expected = colls.instance_of, colls.instances, colls.expected
        self.issue_t = [-1] * n
        self.start: list[int] = []  # per node, once the loop ran (`_plain_starts`)
        self.comm_start: dict[int, int] = {}  # the comm nodes' starts, as the loop sets them
        self.end = [-1] * n
        self.ready_at = array("q", [-1]) * n
        self.ready_cause = array("q", [-1]) * n
        self.issue_cause = array("q", [-1]) * n  # set for comm nodes (a plain node's is its pred): a recv reads it
        self.pred = array("q", [-1]) * n
        self.holder = [-1] * resources  # node holding each resource, -1 = free
        self.last_holder = [-1] * resources
        self.queue: list[list[tuple[int, int, int]]] = [[] for _ in range(resources)]
        self.arrived = [0] * len(colls.instances)
        # per collective instance: the latest issue so far as (time, round, phase, rank index, order) and its cause
        self.latest: list[tuple[int, ...]] = [()] * len(colls.instances)
        self.latest_cause = [-1] * len(colls.instances)
        # a completion is one int, (end time << g_bits) | g: ordered as the pair (end time, g) is, and a heap of
        # ints compares in C, not through a call per tuple element
        self.g_bits = self.time_shift = max(n, 1).bit_length()
        self._init_ranks(len(graph.ranks), n, by_rank)
        self.events = self.heaps[0]  # the heap of the rank being replayed
        self.touched: list[int] = []  # resources whose holder or queue changed since the last dispatch
        self.clock = [(0, 0)] * len(graph.ranks)  # per rank: the time it replayed last and its rounds at it
        self.round = self.phase = 0  # of the comm node issuing: its time's round (0: the roots), 0 drain / 1 dispatch
        self.order = count()

    def _enter(self, ri: int) -> None:
        self.cur = ri
        self.events = self.heaps[ri]

    def run(self) -> None:
        rank_index = self.graph.rank_index
        for g in compress(range(len(self.indeg)), map(not_, self.indeg)):  # the roots, picked in C
            self._enter(rank_index(g))
            self._make_ready(g, 0, -1)
        touched, res_names = self.touched, self.graph.res_names
        for ri, resources in groupby(touched, key=lambda r: res_names[r][0]):  # (in rank order)
            self._enter(ri)
            self.touched = list(resources)
            self._dispatch(0, 0)
        self.touched = []
        self.replay_all()
        self._plain_starts()

    def _plain_starts(self) -> None:
        """Every node's start: a plain node starts when it is issued, so the loop writes only the comm nodes'
        (one list fewer touched per node)."""
        self.start = start = self.issue_t.copy()
        comm_start = self.comm_start
        for g in compress(range(len(self.kind)), self.kind):  # the comm nodes (picked in C): -1 until they start
            start[g] = comm_start.get(g, -1)

    def _replay(self, ri: int) -> None:
        """Rank ri's completions below its horizon in time order (every completion, with by_rank off). What
        `_make_ready`, `_dispatch` and `_issue` do, written out for the plain nodes (most of them): a method call
        per node costs as much as the rest of its work."""
        self._enter(ri)
        events, horizon = self.events, self.horizon
        indeg, children, res, kind, dur = self.indeg, self.children, self.res, self.kind, self.dur
        holder, last_holder, touched, queue = self.holder, self.last_holder, self.touched, self.queue
        ready_at, ready_cause, issue_t, end, pred, node_id = (self.ready_at, self.ready_cause, self.issue_t, self.end,
                                                              self.pred, self.node_id)
        issue, dispatch, pop, push = self._issue, self._dispatch, _pop, _push
        g_bits = self.g_bits
        g_mask = (1 << g_bits) - 1
        below = horizon[ri]
        now, rounds = self.clock[ri]
        while events and events[0] < below:
            t = events[0] >> g_bits
            rounds = rounds + 1 if t == now else 1
            now = t
            after = (t + 1) << g_bits
            # drain every completion at time t before issuing, so the ready-first/lowest-id rule sees them all
            while events and events[0] < after:
                g = pop(events) & g_mask
                r = res[g]
                if r >= 0:
                    holder[r] = -1
                    last_holder[r] = g
                    touched.append(r)
                for c in children[g]:
                    d = indeg[c] - 1
                    indeg[c] = d
                    if d:
                        continue
                    # ready: events pop in time order, so g is the last dep to finish
                    ready_at[c] = t
                    ready_cause[c] = g
                    rc = res[c]
                    if rc >= 0:
                        push(queue[rc], (t, node_id[c], c))
                        touched.append(rc)
                    elif kind[c] == _PLAIN:  # takes no resource: issued and started at once
                        issue_t[c] = t
                        pred[c] = g  # (its issue cause too: only a recv's is read, `_finish_recv`)
                        end[c] = e = t + dur[c]
                        push(events, (e << g_bits) | c)
                    else:
                        self.round, self.phase = rounds, 0  # (where `_arrive` reads them)
                        issue(c, t, g)
            dispatch(t, rounds)
            below = horizon[ri]  # a comm node issued may wait for another rank
        self.clock[ri] = (now, rounds)

    def _make_ready(self, g: int, t: int, cause: int) -> None:
        self.ready_at[g] = t
        self.ready_cause[g] = cause
        r = self.res[g]
        if r < 0:
            self._issue(g, t, cause)
        else:
            _push(self.queue[r], (t, self.node_id[g], g))
            self.touched.append(r)

    def _dispatch(self, t: int, rounds: int) -> None:
        """Issue the first ready node of each free resource that changed (`_issue` written out for plain nodes),
        in round `rounds` at time t."""
        holder, queue, ready_at, ready_cause, last_holder, kind = (self.holder, self.queue, self.ready_at,
                                                                   self.ready_cause, self.last_holder, self.kind)
        issue_t, pred, end, dur, events, g_bits = self.issue_t, self.pred, self.end, self.dur, self.events, self.g_bits
        for r in self.touched:
            if holder[r] < 0 and queue[r]:
                g = _pop(queue[r])[2]
                cause = ready_cause[g] if ready_at[g] == t else last_holder[r]
                if kind[g] == _PLAIN:
                    holder[r] = g
                    issue_t[g] = t
                    pred[g] = cause  # (its issue cause too: only a recv's is read)
                    end[g] = e = t + dur[g]
                    _push(events, (e << g_bits) | g)
                else:
                    self.round, self.phase = rounds, 1  # (where `_arrive` reads them)
                    self._issue(g, t, cause)
        self.touched.clear()

    def _issue(self, g: int, t: int, cause: int) -> None:
        self.issue_t[g] = t
        self.issue_cause[g] = cause
        r = self.res[g]
        if r >= 0:
            self.holder[r] = g
        k = self.kind[g]
        if k == _PLAIN:  # most nodes: inline, not a call to _run_alone (its start: `_plain_starts`)
            self.end[g] = end = t + self.dur[g]
            self.pred[g] = cause
            _push(self.events, (end << self.g_bits) | g)
        elif k == _COLL:
            self._arrive(g, t, cause)
        else:
            self._message(g, t, cause)

    def _run_alone(self, g: int, t: int, cause: int) -> None:
        """Node g runs its own duration from t."""
        self.comm_start[g] = t
        self.end[g] = end = t + self.dur[g]
        self.pred[g] = cause
        _push(self.events, (end << self.g_bits) | g)

    def _message(self, g: int, t: int, cause: int) -> None:
        """A send runs its own duration (eager) and may finish its recv; a recv waits for its send, if it has
        a peer among the ranks given."""
        peer = self.peer[g]
        if self.kind[g] == _RECV and peer != _ALONE:
            self.comm_start[g] = t
            if peer >= 0 and self.issue_t[peer] >= 0:
                self._finish_recv(g, peer, g)
            elif peer >= 0:
                self.wait_elsewhere(g)
            return
        self._run_alone(g, t, cause)
        if self.kind[g] == _SEND and peer >= 0 and self.issue_t[peer] >= 0:
            self._finish_recv(peer, g, g)

    def _arrive(self, g: int, t: int, cause: int) -> None:
        """A collective issued on one member; when every member has, all start at the latest issue."""
        inst = self.instance_of[g]
        self.arrived[inst] += 1
        at = (t, self.round, self.phase, self.cur, next(self.order))
        if not self.by_rank or at > self.latest[inst]:  # (in the global order the latest is the last to come)
            self.latest[inst], self.latest_cause[inst] = at, cause
        if self.arrived[inst] < self.expected[inst]:
            self.wait_elsewhere(g)
            return
        start, end, dur, pred, offset = self.comm_start, self.end, self.dur, self.pred, self.offset
        last = self.latest[inst]
        t, cause = last[0], self.latest_cause[inst]
        for ri, i in self.instances[inst].nodes:
            m = offset[ri] + i
            start[m] = t
            end[m] = t + dur[m]
            pred[m] = cause  # the last arriver's cause: the path skips the waiting
            self._ends_at(ri, m, t, last is at and ri == self.cur)

    def _finish_recv(self, g: int, s: int, now: int) -> None:
        """Recv g ends at the later of its own end and its send's end (`now` of the two just issued)."""
        own_end = self.comm_start[g] + self.dur[g]
        if self.end[s] > own_end:
            self.end[g], self.pred[g] = self.end[s], s
        else:
            self.end[g], self.pred[g] = own_end, self.issue_cause[g]
        ri = self.graph.rank_index(g)
        other = s if now == g else g
        decided = max(self.comm_start[g], self.issue_t[s])
        self._ends_at(ri, g, decided, self.recv_decided_here(ri, self.graph.rank_index(other), self.issue_t[now],
                                                              self.issue_t[other]))

    def _ends_at(self, ri: int, g: int, decided: int, certain: bool) -> None:
        """Comm node g of rank ri got its end (set), as decided at time `decided`; `certain`: by rank ri now, as
        the global order does. Else its event must end after the decision and after rank ri's last replayed time
        (its place among rank ri's events is then its (end, g) alone)."""
        e = self.end[g]
        if self.by_rank and not certain and (e == decided or (ri != self.cur and e <= self.clock[ri][0])):
            raise Ambiguous
        _push(self.heaps[ri], (e << self.g_bits) | g)
        if self.by_rank:
            self.decided(ri, g)

    def _earliest_end(self, g: int) -> int:
        """The earliest a pending comm node g could end: a collective once its last member issued it (at or after
        the latest issue so far and `gvt`), a recv once its send did."""
        if self.kind[g] == _COLL:
            return max(self.latest[self.instance_of[g]][0], self.gvt) + self.dur[g]
        return max(self.comm_start[g] + self.dur[g], self.gvt + self.dur[self.peer[g]])


def packed_ints(values: list[int]) -> MutableSequence[int]:
    """`values` as an array of machine ints, or as they are where one does not fit (a uint64 past 2^63). For the
    columns an event loop reads at every event (both replays): the value in place, not a pointer to an int object
    somewhere in the rank's memory."""
    try:
        return array("q", values)
    except OverflowError:
        return values


# --- results: the critical path, or why nodes never ran


def _critical_path(start: list[int], end: list[int], pred: array[int]) -> tuple[list[int], list[int]]:
    """(path as global indices, earliest first; µs each node adds to it): walk back from the last node to end
    (ties: lowest global index)."""
    g = end.index(max(end)) if end else -1  # the first of the latest
    path: list[int] = []
    while g >= 0:
        path.append(g)
        g = pred[g]
    path.reverse()
    contribution = []
    prev_end = 0
    for g in path:
        contribution.append(end[g] - max(start[g], prev_end))
        prev_end = end[g]
    return path, contribution


class _Diagnosis:
    """The nodes that never ended, and what each waits for."""

    def __init__(self, graph: _Graph, colls: _Collectives, messages: _Messages, loop: _EventLoop) -> None:
        self.graph, self.colls, self.messages, self.loop = graph, colls, messages, loop
        # a node ended when its end was set: every event scheduled was run (no pass per node when all ended)
        end = loop.end
        self.stuck = list(compress(range(len(end)), map(lt, end, repeat(0)))) if min(end, default=0) < 0 else []

    def root_causes_first(self, limit: int) -> list[Stuck]:
        """The first `limit` stuck nodes: issued comm nodes waiting for a peer (the root causes), then resource
        waits, then dep waits."""
        issue_t, ready_at, node_id = self.loop.issue_t, self.loop.ready_at, self.graph.node_id

        def priority(g: int) -> tuple[int, int, int]:
            level = 0 if issue_t[g] >= 0 else 1 if ready_at[g] >= 0 else 2
            return level, self.graph.rank_index(g), node_id[g]

        return [self._explain(g) for g in sorted(self.stuck, key=priority)[:limit]]

    def _explain(self, g: int) -> Stuck:
        ri, i = self.graph.locate(g)
        nd = self.graph.ranks[ri].nodes[i]
        return Stuck(self.graph.rank_of[ri], nd.id, nd.name, self._waits_for(g, ri, nd))

    def _waits_for(self, g: int, ri: int, nd: SimNode) -> str:
        kind, issued = self.graph.kind[g], self.loop.issue_t[g] >= 0
        if issued and kind == _COLL:
            return self._collective_wait(g)
        if issued and kind == _RECV:
            return self._recv_wait(g, ri)
        if self.loop.ready_at[g] >= 0:
            return self._resource_wait(g)
        return self._dep_wait(ri, nd)

    def _collective_wait(self, g: int) -> str:
        graph, issue_t = self.graph, self.loop.issue_t
        inst = self.colls.instances[self.colls.instance_of[g]]
        have = {graph.rank_of[rj]: graph.offset[rj] + j for rj, j in inst.nodes}
        parts = []
        for r in inst.members:
            m = have.get(r)
            if m is None:
                count = self.colls.count.get((inst.pg, graph.index_of_rank[r]), 0)
                parts.append(f"rank {r}, which never issues it (it has {count} collectives of that pg)")
            elif issue_t[m] < 0:
                parts.append(f"rank {r}, whose node {graph.node_id[m]} is itself blocked")
        return f"collective #{inst.seq} of pg {inst.pg!r} issued at {issue_t[g]} us, waits for " + "; ".join(parts)

    def _recv_wait(self, g: int, ri: int) -> str:
        src, _, tag, k = self.messages.recv_channel[g]
        s = self.messages.peer[g]
        if s == _NEVER:
            count = self.messages.send_count.get((src, self.graph.rank_of[ri], tag), 0)
            return f"recv #{k} from rank {src} tag {tag}: rank {src} never sends it ({count} matching sends)"
        return f"recv #{k} from rank {src} tag {tag}: rank {src}'s send node {self.graph.node_id[s]} is itself blocked"

    def _resource_wait(self, g: int) -> str:
        r = self.graph.res[g]
        h = self.loop.holder[r]
        return (f"ready at {self.loop.ready_at[g]} us, waits for {self.graph.res_names[r][1]}, held by node "
                f"{self.graph.node_id[h]} (itself blocked)")

    def _dep_wait(self, ri: int, nd: SimNode) -> str:
        base, end = self.graph.offset[ri], self.loop.end
        pos = {d.id: base + j for j, d in enumerate(self.graph.ranks[ri].nodes)}
        open_deps = sorted(d for d in set(nd.deps) if end[pos[d]] < 0)
        shown = ", ".join(str(d) for d in open_deps[:5]) + (", ..." if len(open_deps) > 5 else "")
        return f"waits for {len(open_deps)} unfinished deps: {shown}"

