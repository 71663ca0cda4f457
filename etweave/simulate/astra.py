"""`etweave simulate --model astra-sim`: ASTRA-sim's issue rules, so etweave predicts what ASTRA-sim computes.

The rules, as measured on the real simulator (docs: FORMATS.md section 3b):
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
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from sys import intern

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.chakra.io import attr_value, iter_et
from etweave.errors import BadInput
from etweave.runfolder import file_rank
from etweave.simulate.engine import GraphError
from etweave.simulate.network import DEFAULT_NETWORK, NETWORK_TIMED, Network, collective_ns, send_ns

CPU, GPU, COMM, FREE = 0, 1, 2, 3  # the slot a node takes; FREE = none
SLOT_NAMES = ("CPU", "GPU", "comm")
COLLECTIVE_TIMING = ("network", "duration")
_WANTED = frozenset({"kind", "is_cpu_op", "comm_type", "comm_size", "pg_name", "comm_src", "comm_dst", "comm_tag",
                     "measured_duration_micros"})
# engine-internal node kinds
_COMP, _COLL, _BCAST, _SEND, _RECV = 0, 1, 2, 3, 4
_ALONE, _NEVER = -1, -2  # send/recv peer markers, as in engine.py


@dataclass(slots=True)
class AstraNode:
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


@dataclass(slots=True)
class AstraRank:
    rank: int  # the NPU it is replayed as
    nodes: list[AstraNode]
    source: str = ""
    replica: bool = False  # one trace replayed as several NPUs: its sends and recvs have no peer among them


@dataclass
class AstraRun:
    ranks: list[AstraRank]
    collectives: str  # "network" or "duration"
    slots: bool
    finished_ns: list[int | None]  # per rank index; None = never finished (stuck nodes)
    slot_wait_ns: list[list[int]]  # per rank index, per slot (CPU, GPU, comm): ready → issue, summed
    # per rank index: ns a slot was held while another node waited for it, by (slot, the holder's kind)
    blocked_by: list[dict[tuple[int, str], int]] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)  # "rank R node N name: why", at most MAX_STUCK
    stuck_count: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def makespan_ns(self) -> int:
        return max((f for f in self.finished_ns if f is not None), default=0)


MAX_STUCK = 10


def _as_int(value: object, default: int = 0) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def load_astra_rank(path: Path, default_rank: int | None = None) -> AstraRank:
    """One `.et` file, read the way ASTRA-sim's feeder reads it (only the fields it uses, plus measured times).
    Its rank as `etweave simulate` finds it (`runfolder.file_rank`)."""
    metadata, nodes = iter_et(path)  # one protobuf node at a time: only the AstraNodes stay
    rank = file_rank(metadata, path, default_rank)
    out = []
    for nd in nodes:
        attrs = {a.name: attr_value(a) for a in nd.attr if a.name in _WANTED}
        cpu = attrs.get("is_cpu_op", True)
        # interned: names and kinds repeat over nodes and ranks (memory per distinct string, as in load.py)
        an = AstraNode(id=nd.id, name=intern(nd.name), type=nd.type, deps=tuple(nd.data_deps) + tuple(nd.ctrl_deps),
                       duration_us=nd.duration_micros, is_cpu_op=bool(cpu),
                       measured_start=nd.start_time_micros, kind=intern(str(attrs.get("kind", ""))))
        an.measured_end = nd.start_time_micros + _as_int(attrs.get("measured_duration_micros"), nd.duration_micros)
        if nd.type in COMM_NODE_TYPES:
            an.comm_size = _as_int(attrs.get("comm_size"))
            if "comm_type" in attrs:
                an.comm_type = _as_int(attrs["comm_type"])
            pg = attrs.get("pg_name", "")
            an.pg = pg if isinstance(pg, str) else str(pg)
            for name in ("comm_src", "comm_dst", "comm_tag"):
                if name in attrs:
                    setattr(an, name, _as_int(attrs[name]))
        out.append(an)
    return AstraRank(rank=rank, nodes=out, source=str(path))


def measured_span_us(ranks: Sequence[AstraRank]) -> int | None:
    """Earliest measured start to latest measured end over all ranks (as `etweave simulate` reports it)."""
    lo = hi = None
    for rg in ranks:
        for nd in rg.nodes:
            if nd.measured_start:
                lo = nd.measured_start if lo is None else min(lo, nd.measured_start)
                hi = nd.measured_end if hi is None else max(hi, nd.measured_end)
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
             collectives: str = "network", slots: bool = True, slotless_kinds: Collection[str] = ()) -> AstraRun:
    """Replay `ranks` (one per NPU) under ASTRA-sim's rules; see the module docstring. `slotless_kinds`: nodes
    whose attr `kind` is one of these take no slot (a what-if for the benchmark: e.g. "delay" asks what the
    run would take if waiting nodes did not hold the CPU slot; ASTRA-sim itself has no such rule)."""
    if collectives not in COLLECTIVE_TIMING:
        raise ValueError(f"collectives must be one of {COLLECTIVE_TIMING}")
    ranks = list(ranks)
    rank_of = [rg.rank for rg in ranks]
    index_of_rank = {r: ri for ri, r in enumerate(rank_of)}
    if len(index_of_rank) != len(ranks):
        raise GraphError(None, "a rank is given more than once")
    npus = len(ranks)
    notes: list[str] = []

    # --- flatten: global index g = offset[rank index] + node index
    offset, n = [], 0
    for rg in ranks:
        offset.append(n)
        n += len(rg.nodes)
    kind = [_COMP] * n
    slot = [CPU] * n
    dur_ns = [0] * n  # own time: duration_micros × 1000, 0 → 1 ns
    node_id = [0] * n
    owner = [0] * n
    indeg = [0] * n
    children: list[list[int]] = [[] for _ in range(n)]
    for ri, rg in enumerate(ranks):
        pos: dict[int, int] = {}
        for i, nd in enumerate(rg.nodes):
            if nd.id in pos:
                raise GraphError(ri, f"node id {nd.id} appears twice")
            pos[nd.id] = offset[ri] + i
        for i, nd in enumerate(rg.nodes):
            g = offset[ri] + i
            kind[g], slot[g] = _kind_and_slot(nd, ri)
            if nd.kind in slotless_kinds:
                slot[g] = FREE
            dur_ns[g] = max(1, nd.duration_us * 1000)
            node_id[g] = nd.id
            owner[g] = ri
            for d in set(nd.deps):
                p = pos.get(d)
                if p is None:
                    raise GraphError(ri, f"node {nd.id} depends on node {d}, which is not in the file")
                children[p].append(g)
                indeg[g] += 1
    if not slots:
        slot = [FREE] * n

    # --- collective instances: the k-th of a group on each member rank (ascending id)
    inst_of = [-1] * n
    inst_nodes: list[list[int]] = []
    inst_size: list[int] = []  # members among the NPUs given
    per_pg: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for g in range(n):
        if kind[g] == _COLL:
            ri = owner[g]
            per_pg[ranks[ri].nodes[g - offset[ri]].pg][ri].append(g)
    for pg, by_rank in sorted(per_pg.items()):
        if pg in ("", "0"):
            members = list(range(npus))
        elif pg not in groups:
            ri = min(by_rank)
            raise GraphError(ri, f"collective node {node_id[by_rank[ri][0]]} uses pg_name {pg!r}, which the "
                                 "comm-group map does not list")
        else:
            members = sorted(index_of_rank[r] for r in groups[pg] if r in index_of_rank)
            outside = [ri for ri in by_rank if ri not in members]
            if outside:
                raise GraphError(outside[0], f"rank {rank_of[outside[0]]} issues collectives of pg {pg!r}, "
                                             f"whose members are {sorted(groups[pg])}")
        for lst in by_rank.values():
            lst.sort(key=lambda g: node_id[g])
        for k in range(max(len(v) for v in by_rank.values())):
            inst = [by_rank[ri][k] for ri in members if k < len(by_rank.get(ri, []))]
            for g in inst:
                inst_of[g] = len(inst_nodes)
            inst_nodes.append(inst)
            inst_size.append(len(members))

    # --- send/recv channels
    peer = [_ALONE] * n
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for g in range(n):
        if kind[g] in (_SEND, _RECV):
            ri = owner[g]
            nd = ranks[ri].nodes[g - offset[ri]]
            if nd.comm_src is None or nd.comm_dst is None or nd.comm_tag is None:
                raise GraphError(ri, f"send/recv node {nd.id} lacks comm_src, comm_dst or comm_tag")
            (sends if kind[g] == _SEND else recvs)[(nd.comm_src, nd.comm_dst, nd.comm_tag)].append(g)
    alone = 0
    for table, other_table, peer_side in ((sends, recvs, 1), (recvs, sends, 0)):
        for key, lst in table.items():
            lst.sort(key=lambda g: node_id[g])
            other = sorted(other_table.get(key, []), key=lambda g: node_id[g])
            for k, g in enumerate(lst):
                own = key[1 - peer_side]
                if ranks[owner[g]].replica or key[peer_side] not in index_of_rank or own != rank_of[owner[g]]:
                    alone += 1
                else:
                    peer[g] = other[k] if k < len(other) else _NEVER
    if alone:
        notes.append(f"{alone} send/recv nodes have no peer among the NPUs given: replayed alone")

    def coll_ns(g: int) -> int:
        if collectives == "duration":
            return dur_ns[g]
        nd = ranks[owner[g]].nodes[g - offset[owner[g]]]
        return collective_ns(network, nd.comm_type or 0, nd.comm_size, inst_size[inst_of[g]])

    def p2p_ns(g: int) -> int:
        if collectives == "duration":
            return dur_ns[g]
        nd = ranks[owner[g]].nodes[g - offset[owner[g]]]
        return send_ns(network, nd.comm_size, nd.comm_src or 0, nd.comm_dst or 0, npus)

    # --- the event loop: (time, sequence, g); equal times complete in the order they were scheduled
    issue_t = [-1] * n
    ready_t = [-1] * n
    end = [-1] * n
    done = [False] * n
    busy = [[False] * 3 for _ in ranks]
    ready: list[list[list[tuple[int, int]]]] = [[[] for _ in range(4)] for _ in ranks]  # (node id, g) heaps
    arrived = [0] * len(inst_nodes)
    slot_wait = [[0] * 3 for _ in ranks]
    holder = [[-1] * 3 for _ in ranks]
    since = [[0] * 3 for _ in ranks]  # when each slot's (holder, someone waiting) state was last accounted
    blocked: list[dict[tuple[int, str], int]] = [defaultdict(int) for _ in ranks]
    kind_name = [nd.kind or pb.NodeType.Name(nd.type) for rg in ranks for nd in rg.nodes]
    events: list[tuple[int, int, int]] = []
    seq = 0
    push, pop = heapq.heappush, heapq.heappop

    def finish_at(g: int, t: int) -> None:
        nonlocal seq
        end[g] = t
        seq += 1
        push(events, (t, seq, g))

    def recv_done(r: int, s: int) -> None:  # recv r issued, its send s issued: r ends when the message arrived
        finish_at(r, max(issue_t[r], issue_t[s] + p2p_ns(s)) if collectives == "network"
                  else max(issue_t[r] + dur_ns[r], issue_t[s] + dur_ns[s]))

    def issue(g: int, t: int) -> None:
        issue_t[g] = t
        s = slot[g]
        if s != FREE:
            busy[owner[g]][s] = True
            holder[owner[g]][s] = g
            slot_wait[owner[g]][s] += t - ready_t[g]
        k = kind[g]
        if k in (_COMP, _BCAST):
            finish_at(g, t + dur_ns[g])
        elif k == _COLL:
            inst = inst_of[g]
            arrived[inst] += 1
            if arrived[inst] == inst_size[inst]:
                for m in inst_nodes[inst]:
                    finish_at(m, t + coll_ns(m))
        elif k == _SEND:
            finish_at(g, t + p2p_ns(g))
            r = peer[g]
            if r >= 0 and issue_t[r] >= 0:
                recv_done(r, g)
        else:  # recv
            s2 = peer[g]
            if s2 == _ALONE:
                finish_at(g, t + dur_ns[g])
            elif s2 >= 0 and issue_t[s2] >= 0:
                recv_done(g, s2)

    def issue_ready(ri: int, t: int) -> None:
        # ASTRA-sim visits the ready nodes in ascending id and issues each whose slot is free: per slot that is
        # its lowest ready node; every slot-free node issues. Issue them in id order (it orders equal-time events).
        heaps = ready[ri]
        picked: list[tuple[int, int]] = []
        for s in (CPU, GPU, COMM):
            if heaps[s] and not busy[ri][s]:
                picked.append(pop(heaps[s]))
        picked += heaps[FREE]
        heaps[FREE] = []
        for _, g in sorted(picked):
            issue(g, t)

    def make_ready(g: int, t: int) -> None:
        ready_t[g] = t
        push(ready[owner[g]][slot[g]], (node_id[g], g))

    for g in range(n):
        if indeg[g] == 0:
            make_ready(g, 0)
    for ri in range(npus):
        issue_ready(ri, 0)
    while events:
        t, _, g = pop(events)
        done[g] = True
        ri = owner[g]
        for s in (CPU, GPU, COMM):  # the rank's slot states change only at its own events: account up to now
            h = holder[ri][s]
            if h >= 0 and ready[ri][s]:
                blocked[ri][s, kind_name[h]] += t - since[ri][s]
            since[ri][s] = t
        if slot[g] != FREE:
            busy[ri][slot[g]] = False
            holder[ri][slot[g]] = -1
        for c in children[g]:
            indeg[c] -= 1
            if indeg[c] == 0:
                make_ready(c, t)
        issue_ready(ri, t)

    finished: list[int | None] = []
    for ri, rg in enumerate(ranks):
        span = range(offset[ri], offset[ri] + len(rg.nodes))
        finished.append(None if any(not done[g] for g in span) else max((end[g] for g in span), default=0))
    run = AstraRun(ranks=ranks, collectives=collectives, slots=slots, finished_ns=finished, slot_wait_ns=slot_wait,
                   blocked_by=[dict(b) for b in blocked], notes=notes)
    stuck = [g for g in range(n) if not done[g]]
    run.stuck_count = len(stuck)
    for g in sorted(stuck, key=lambda g: (issue_t[g] < 0, ready_t[g] < 0, owner[g], node_id[g]))[:MAX_STUCK]:
        ri = owner[g]
        why = ("issued, waits for its peers" if issue_t[g] >= 0 else
               f"ready, waits for the {SLOT_NAMES[slot[g]]} slot" if ready_t[g] >= 0 else "waits for its deps")
        run.stuck.append(f"rank {rank_of[ri]} node {node_id[g]} {ranks[ri].nodes[g - offset[ri]].name!r}: {why}")
    return run


def replicate(rank: AstraRank, npus: int) -> list[AstraRank]:
    """One rank's trace replayed as `npus` NPUs (ASTRA-sim refuses one NPU: FORMATS.md 3b.7)."""
    return [AstraRank(rank=r, nodes=rank.nodes, source=rank.source, replica=True) for r in range(npus)]


def load_for_astra(files: Sequence[Path], npus: int | None = None) -> list[AstraRank]:
    """The NPUs to replay: one per file, or a single file replayed as `npus` NPUs (default 2: ASTRA-sim refuses 1)."""
    loaded = [load_astra_rank(f, default_rank=0 if len(files) == 1 else None) for f in files]
    if len(loaded) == 1:
        return replicate(loaded[0], 2 if npus is None else npus)
    if npus is not None and npus != len(loaded):
        raise BadInput(files[0], f"--npus {npus}: only a single trace can be replayed as several NPUs "
                                 f"({len(loaded)} given)")
    return loaded
