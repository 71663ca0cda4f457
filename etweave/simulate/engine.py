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
  among that rank's collectives of that group) matches the k-th on every other member.
- Send/recv: the k-th send from rank S to rank D with tag T matches the k-th recv on D from S with tag T
  (ascending id). A send is eager: it runs its own duration and never waits for the receiver. A recv starts
  when issued and ends at max(its start + its duration, the matching send's start + the send's duration).
  A node whose peer rank is not among the ranks given runs on its own duration.
"""

from __future__ import annotations

import heapq
from array import array
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from etweave.chakra import et_def_pb2 as pb

COLL, SEND, RECV = pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE

# engine-internal kinds, kept as small ints so the hot loop compares ints
_PLAIN, _COLL, _SEND, _RECV = 0, 1, 2, 3
_KIND = {COLL: _COLL, SEND: _SEND, RECV: _RECV}

# peer markers for send/recv
_ALONE = -1  # peer rank not among the ranks given: run alone
_NEVER = -2  # peer rank given, but it has no matching node: a recv waits forever


@dataclass(slots=True)
class SimNode:
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


@dataclass(slots=True)
class RankGraph:
    rank: int
    nodes: list[SimNode]
    source: str = ""  # file it came from, for messages


@dataclass(slots=True)
class CollInstance:
    """The k-th collective of group `pg`: its nodes as (rank index, node index), on the ranks that issue it."""

    pg: str
    seq: int
    members: list[int]  # global ranks among those given that belong to the group
    nodes: list[tuple[int, int]]


@dataclass(slots=True)
class Stuck:
    rank: int  # global rank
    node_id: int
    name: str
    waits_for: str


@dataclass
class Replay:
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


class UnknownGroup(GraphError):
    """A collective names a pg that the group map does not list."""


MAX_STUCK = 20


def replay(ranks: Sequence[RankGraph], groups: Mapping[str, Sequence[int]]) -> Replay:
    """Replay `ranks` together. `groups` maps a pg name to its global ranks ("" needs no entry: all ranks)."""
    ranks = list(ranks)
    rank_of = [rg.rank for rg in ranks]
    index_of_rank: dict[int, int] = {}
    for ri, r in enumerate(rank_of):
        if r in index_of_rank:
            other = ranks[index_of_rank[r]].source or f"graph #{index_of_rank[r]}"
            raise GraphError(ri, f"rank {r} given more than once (also {other})")
        index_of_rank[r] = ri
    given = set(rank_of)
    notes: list[str] = []

    # --- flatten: global index g = offset[rank index] + node index
    offset: list[int] = []
    n = 0
    for rg in ranks:
        offset.append(n)
        n += len(rg.nodes)
    dur = [0] * n
    kind = [_PLAIN] * n
    res = [-1] * n
    node_id = [0] * n
    indeg = array("q", bytes(8 * n))  # machine ints, not int objects: memory per node stays small at 1000 ranks
    edge_from, edge_to = array("q"), array("q")  # every dependency edge (p -> g), then grouped by p below
    res_names: list[tuple[int, str]] = []  # resource index -> (rank index, label)
    for ri, rg in enumerate(ranks):
        base = offset[ri]
        pos: dict[int, int] = {}  # node id -> g, this rank's only (a map per rank of them all costs ~100 B/node)
        for i, nd in enumerate(rg.nodes):
            if nd.id in pos:
                raise GraphError(ri, f"node id {nd.id} appears twice")
            pos[nd.id] = base + i
        res_index: dict[str, int] = {}
        for i, nd in enumerate(rg.nodes):
            g = base + i
            dur[g] = nd.duration
            kind[g] = _KIND.get(nd.type, _PLAIN)
            node_id[g] = nd.id
            if nd.resource is not None:
                r = res_index.get(nd.resource)
                if r is None:
                    r = res_index[nd.resource] = len(res_names)
                    res_names.append((ri, nd.resource))
                res[g] = r
            for d in set(nd.deps):
                p = pos.get(d)
                if p is None:
                    raise GraphError(ri, f"node {nd.id} depends on node {d}, which is not in the file")
                edge_from.append(p)
                edge_to.append(g)
                indeg[g] += 1

    # children of g: child_list[child_at[g]:child_at[g + 1]], in the order the edges were found (as the list per
    # node they replace: one flat array instead of a list object per node)
    child_at = array("q", bytes(8 * (n + 1)))
    for p in edge_from:
        child_at[p + 1] += 1
    for g in range(n):
        child_at[g + 1] += child_at[g]
    fill = child_at[:-1]
    child_list = array("q", bytes(8 * len(edge_to)))
    for p, g in zip(edge_from, edge_to, strict=True):
        child_list[fill[p]] = g
        fill[p] += 1
    del edge_from, edge_to, fill

    # --- collectives: the k-th of each group on each member rank, matched across ranks
    coll_inst = [-1] * n
    instances: list[CollInstance] = []
    inst_expected: list[int] = []
    per_pg: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for ri, rg in enumerate(ranks):
        for i, nd in enumerate(rg.nodes):
            if nd.type == COLL:
                per_pg[nd.pg or ""][ri].append(i)
    for pg, by_rank in sorted(per_pg.items()):
        if pg == "":
            members = sorted(given)
        else:
            if pg not in groups:
                ri = min(by_rank)
                raise UnknownGroup(ri, f"collective node {ranks[ri].nodes[by_rank[ri][0]].id} uses pg_name {pg!r}, "
                                     "which the comm-group map does not list")
            listed = {int(r) for r in groups[pg]}
            for ri in by_rank:
                if rank_of[ri] not in listed:
                    raise GraphError(ri, f"rank {rank_of[ri]} issues collectives of pg {pg!r}, "
                                         f"whose members are {sorted(listed)}")
            missing = sorted(listed - given)
            if missing:
                notes.append(f"pg {pg!r}: members {missing} are not among the files given: ignored")
            members = sorted(listed & given)
        for ri in by_rank:
            by_rank[ri].sort(key=lambda i, ri=ri: ranks[ri].nodes[i].id)  # issue order = ascending id
        for k in range(max(len(v) for v in by_rank.values())):
            nodes = []
            for r in members:
                ri = index_of_rank[r]
                lst = by_rank.get(ri, [])
                if k < len(lst):
                    nodes.append((ri, lst[k]))
                    coll_inst[offset[ri] + lst[k]] = len(instances)
            instances.append(CollInstance(pg, k, members, nodes))
            inst_expected.append(len(members))

    # --- send/recv: k-th send S->D tag T pairs with the k-th recv on D from S tag T
    peer = [_ALONE] * n
    chan_key: dict[int, tuple[int, int, int, int]] = {}  # g -> (src, dst, tag, k), for messages
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for ri, rg in enumerate(ranks):
        for i, nd in enumerate(rg.nodes):
            if nd.type not in (SEND, RECV):
                continue
            if nd.comm_src is None or nd.comm_dst is None or nd.comm_tag is None:
                raise GraphError(ri, f"{'send' if nd.type == SEND else 'recv'} node {nd.id} lacks "
                                     "comm_src, comm_dst or comm_tag")
            key = (nd.comm_src, nd.comm_dst, nd.comm_tag)
            own = nd.comm_src if nd.type == SEND else nd.comm_dst
            if own != rank_of[ri]:
                side = "comm_src" if nd.type == SEND else "comm_dst"
                raise GraphError(ri, f"node {nd.id} has {side} {own} but the file is rank {rank_of[ri]}")
            (sends if nd.type == SEND else recvs)[key].append(offset[ri] + i)
    alone = 0
    unmatched_sends = 0
    for table, other_table, peer_pos in ((sends, recvs, 1), (recvs, sends, 0)):
        for key, lst in table.items():
            lst.sort(key=lambda g: node_id[g])
            other = sorted(other_table.get(key, []), key=lambda g: node_id[g])
            for k, g in enumerate(lst):
                chan_key[g] = (*key, k)
                if key[peer_pos] not in given:
                    alone += 1
                elif k < len(other):
                    peer[g] = other[k]
                else:
                    peer[g] = _NEVER
                    if table is sends:
                        unmatched_sends += 1
    if alone:
        notes.append(f"{alone} send/recv nodes have their peer rank outside the files given: replayed alone")
    if unmatched_sends:
        notes.append(f"{unmatched_sends} sends have no matching recv on their (given) peer rank")

    # --- the event loop
    issue_t = [-1] * n
    start = [-1] * n
    end = [-1] * n
    ready_at = array("q", [-1]) * n
    ready_cause = array("q", [-1]) * n
    issue_cause = array("q", [-1]) * n
    pred = array("q", [-1]) * n  # what determined this node's timing, for the critical path
    done = [False] * n
    holder = [-1] * len(res_names)  # node holding each resource, -1 = free
    last_holder = [-1] * len(res_names)
    queue: list[list[tuple[int, int, int]]] = [[] for _ in res_names]  # (ready time, node id, g)
    arrived = [0] * len(instances)
    events: list[tuple[int, int]] = []  # (end time, g)
    touched: list[int] = []
    push, pop = heapq.heappush, heapq.heappop

    def do_issue(g: int, t: int, cause: int) -> None:
        issue_t[g] = t
        issue_cause[g] = cause
        r = res[g]
        if r >= 0:
            holder[r] = g
        k = kind[g]
        if k in (_PLAIN, _SEND) or (k == _RECV and peer[g] == _ALONE):
            start[g] = t
            end[g] = t + dur[g]
            pred[g] = cause
            push(events, (end[g], g))
            if k == _SEND and peer[g] >= 0 and issue_t[peer[g]] >= 0:
                finish_recv(peer[g], g)
        elif k == _COLL:
            inst = coll_inst[g]
            arrived[inst] += 1
            if arrived[inst] == inst_expected[inst]:
                for ri, i in instances[inst].nodes:
                    m = offset[ri] + i
                    start[m] = t
                    end[m] = t + dur[m]
                    pred[m] = cause  # the last arriver's cause: the path skips the waiting
                    push(events, (end[m], m))
        else:  # a recv with a given peer
            start[g] = t
            s = peer[g]
            if s >= 0 and issue_t[s] >= 0:
                finish_recv(g, s)

    def finish_recv(g: int, s: int) -> None:
        own_end = start[g] + dur[g]
        if end[s] > own_end:
            end[g], pred[g] = end[s], s
        else:
            end[g], pred[g] = own_end, issue_cause[g]
        push(events, (end[g], g))

    def make_ready(g: int, t: int, cause: int) -> None:
        ready_at[g] = t
        ready_cause[g] = cause
        r = res[g]
        if r < 0:
            do_issue(g, t, cause)
        else:
            push(queue[r], (t, node_id[g], g))
            touched.append(r)

    def dispatch(t: int) -> None:
        for r in touched:
            if holder[r] < 0 and queue[r]:
                _, _, g = pop(queue[r])
                do_issue(g, t, ready_cause[g] if ready_at[g] == t else last_holder[r])
        touched.clear()

    for g in range(n):
        if indeg[g] == 0:
            make_ready(g, 0, -1)
    dispatch(0)
    while events:
        t = events[0][0]
        # drain every completion at time t before issuing, so the ready-first/lowest-id rule sees them all
        while events and events[0][0] == t:
            _, g = pop(events)
            done[g] = True
            r = res[g]
            if r >= 0:
                holder[r] = -1
                last_holder[r] = g
                touched.append(r)
            for c in child_list[child_at[g]:child_at[g + 1]]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    make_ready(c, t, g)  # events pop in time order, so g is the last dep to finish
        dispatch(t)

    # --- results
    makespan = max(end, default=0)
    out = Replay(
        ranks=ranks,
        issue=[issue_t[offset[ri]: offset[ri] + len(rg.nodes)] for ri, rg in enumerate(ranks)],
        start=[start[offset[ri]: offset[ri] + len(rg.nodes)] for ri, rg in enumerate(ranks)],
        end=[end[offset[ri]: offset[ri] + len(rg.nodes)] for ri, rg in enumerate(ranks)],
        makespan=makespan,
        critical_path=[],
        contribution=[],
        collectives=instances,
        notes=notes,
    )

    def locate(g: int) -> tuple[int, int]:
        ri = _rank_index(offset, g)
        return ri, g - offset[ri]

    stuck = [g for g in range(n) if not done[g]]
    if stuck:

        def explain(g: int) -> Stuck:
            ri, i = locate(g)
            nd = ranks[ri].nodes[i]
            return Stuck(rank_of[ri], nd.id, nd.name, waits_for(g, ri, nd))

        def waits_for(g: int, ri: int, nd: SimNode) -> str:
            if issue_t[g] >= 0 and kind[g] == _COLL:
                inst = instances[coll_inst[g]]
                have = {rank_of[rj]: offset[rj] + j for rj, j in inst.nodes}
                parts = []
                for r in inst.members:
                    m = have.get(r)
                    if m is None:
                        count = len(per_pg[inst.pg].get(index_of_rank[r], []))
                        parts.append(f"rank {r}, which never issues it (it has {count} collectives of that pg)")
                    elif issue_t[m] < 0:
                        parts.append(f"rank {r}, whose node {node_id[m]} is itself blocked")
                return (f"collective #{inst.seq} of pg {inst.pg!r} issued at {issue_t[g]} us, waits for "
                        + "; ".join(parts))
            if issue_t[g] >= 0 and kind[g] == _RECV:
                src, _, tag, k = chan_key[g]
                s = peer[g]
                if s == _NEVER:
                    count = len(sends.get((src, rank_of[ri], tag), []))
                    return f"recv #{k} from rank {src} tag {tag}: rank {src} never sends it ({count} matching sends)"
                return f"recv #{k} from rank {src} tag {tag}: rank {src}'s send node {node_id[s]} is itself blocked"
            if ready_at[g] >= 0:
                h = holder[res[g]]
                return (f"ready at {ready_at[g]} us, waits for {res_names[res[g]][1]}, held by node "
                        f"{node_id[h]} (itself blocked)")
            pos = {d.id: offset[ri] + j for j, d in enumerate(ranks[ri].nodes)}
            open_deps = sorted(d for d in set(nd.deps) if not done[pos[d]])
            shown = ", ".join(str(d) for d in open_deps[:5]) + (", ..." if len(open_deps) > 5 else "")
            return f"waits for {len(open_deps)} unfinished deps: {shown}"

        def priority(g: int) -> tuple[int, int, int]:
            # issued comm nodes waiting for a peer are the root causes; then resource waits; then dep waits
            level = 0 if issue_t[g] >= 0 else 1 if ready_at[g] >= 0 else 2
            return level, _rank_index(offset, g), node_id[g]

        stuck.sort(key=priority)
        out.stuck_count = len(stuck)
        out.stuck = [explain(g) for g in stuck[:MAX_STUCK]]
        return out

    # critical path: walk back from the last node to end (ties: lowest rank index, then node index)
    g = max(range(n), key=lambda x: (end[x], -x)) if n else -1
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
    out.critical_path = [locate(g) for g in path]
    out.contribution = contribution
    return out


def _rank_index(offset: list[int], g: int) -> int:
    lo, hi = 0, len(offset) - 1
    while lo < hi:  # last offset <= g
        mid = (lo + hi + 1) // 2
        if offset[mid] <= g:
            lo = mid
        else:
            hi = mid - 1
    return lo
