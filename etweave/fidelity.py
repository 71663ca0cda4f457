"""Fidelity of an output graph against the measured run: the critical path (longest path through the DAG with
`duration_micros` and unlimited resources) against the measured span, and each node's replayed start (as soon
as its predecessors are done) against its measured start."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from etweave.chakra import schema
from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.chakra.io import node_attrs
from etweave.deps.evidence import Evidence
from etweave.model import DELAY, GPU_KINDS, UNTRACED, WAKEUP, Graph
from etweave.stats import upper_percentile

if TYPE_CHECKING:
    from etweave.chakra import et_def_pb2 as pb


class Fidelity(msgspec.Struct):
    span: float  # measured: earliest start to latest end over the nodes with a measured start
    critical_path: float
    start_error_p50: float  # |replayed - measured| start of GPU ops, in % of the span
    start_error_p95: float
    start_error_max: float
    collective_error_max: float  # the same over comm nodes
    no_predecessor: list[int]  # nodes other than the first of their thread/stream with no predecessor

    @property
    def critical_path_error(self) -> float:
        return 100.0 * (self.critical_path - self.span) / self.span if self.span else 0.0


def asap(nodes: Sequence[pb.Node], durations: dict[int, float] | None = None) -> dict[int, float]:
    """Earliest start of every node with unlimited resources (Kahn's order; the graph must be acyclic)."""
    dur = {n.id: float(n.duration_micros) for n in nodes}
    if durations:
        dur.update(durations)
    succ: dict[int, list[int]] = {}
    indeg: dict[int, int] = {}
    for n in nodes:
        preds = set(n.data_deps) | set(n.ctrl_deps)
        indeg[n.id] = len(preds)
        for p in preds:
            succ.setdefault(p, []).append(n.id)
    start = dict.fromkeys(indeg, 0.0)
    ready = [i for i, d in indeg.items() if d == 0]
    while ready:
        i = ready.pop()
        end = start[i] + dur[i]
        for j in succ.get(i, ()):
            if end > start[j]:
                start[j] = end
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return start


def measure(nodes: Sequence[pb.Node]) -> Fidelity:
    measured = [n for n in nodes if n.start_time_micros > 0]
    t0 = min((n.start_time_micros for n in measured), default=0)
    t1 = max((n.start_time_micros + n.duration_micros for n in measured), default=0)
    for n in measured:  # a comm node shortened to its transfer time still ended at its measured end
        a = node_attrs(n)
        measured_duration = a.get("measured_duration_micros")
        if isinstance(measured_duration, (int, float)):  # an int64_val attr, as convert-run writes it
            t1 = max(t1, n.start_time_micros + int(measured_duration))
    span = float(t1 - t0)
    start = asap(nodes)
    cp = max((start[n.id] + n.duration_micros for n in nodes), default=0.0)
    gpu_err: list[float] = []
    comm_err: list[float] = []
    no_pred: list[int] = []
    firsts: set[tuple[object, ...]] = set()
    for n in nodes:  # ascending id
        a = node_attrs(n)
        is_gpu = "stream" in a
        if n.start_time_micros > 0 and span > 0 and (is_gpu or n.type in COMM_NODE_TYPES):
            err = 100.0 * abs(start[n.id] - (n.start_time_micros - t0)) / span
            (comm_err if n.type in COMM_NODE_TYPES else gpu_err).append(err)
            if n.type in COMM_NODE_TYPES and is_gpu:
                gpu_err.append(err)
        if not n.data_deps and not n.ctrl_deps and n.type != schema.METADATA_NODE:
            key = ("gpu", a.get("device"), a.get("stream")) if is_gpu else ("cpu", a.get("tid"))
            if key in firsts:
                no_pred.append(n.id)
            firsts.add(key)
    return Fidelity(span, cp, upper_percentile(gpu_err, 0.5), upper_percentile(gpu_err, 0.95),
                    max(gpu_err, default=0.0), max(comm_err, default=0.0), no_pred)


# Node kinds that stand for no measured op: time the graph keeps as a fixed duration because no evidence says
# what it waited for (`delay`: an idle stream, or a thread before anything was handed to it), the measured latency of
# a thread waking up after what it waited for (`wakeup`), and time a thread spent in code no profiler recorded
# (`untraced`).
NO_OP_KINDS = frozenset({DELAY, WAKEUP, UNTRACED})
RANK_START_OFFSET = "[rank start offset]"  # an initial condition of a whole run, reported beside the share


class PathNode(NamedTuple):
    """What the critical path needs of a node (built from protobuf nodes or from a graph before nodes exist)."""

    id: int
    name: str
    kind: str
    duration: float
    preds: tuple[int, ...]


class DelayShare(msgspec.Struct):
    critical_path: float  # µs, unlimited resources
    share: float  # % of the critical path (less the rank start offset) in nodes of NO_OP_KINDS
    rank_start_offset: float  # µs of the critical path in the `[rank start offset]` node, not in `share`
    by_kind: dict[str, float]  # µs of the critical path per kind of NO_OP_KINDS
    on_path: list[int]  # ids of the critical path, first to last


def path_nodes(nodes: Sequence[pb.Node]) -> list[PathNode]:
    out = []
    for n in nodes:
        kind = next((a.string_val for a in n.attr if a.name == "kind"), "")
        out.append(PathNode(n.id, n.name, kind, float(n.duration_micros), tuple({*n.data_deps, *n.ctrl_deps})))
    return out


def critical_path(nodes: Sequence[PathNode], durations: dict[int, float] | None = None) -> tuple[float, list[int]]:
    """Length of the longest path with unlimited resources, and its node ids (first to last)."""
    index = {n.id: k for k, n in enumerate(nodes)}
    dur = [n.duration for n in nodes]
    if durations:
        for i, d in durations.items():
            dur[index[i]] = d
    src: list[int] = []
    dst: list[int] = []
    for k, n in enumerate(nodes):
        for p in n.preds:
            src.append(index[p])
            dst.append(k)
    ids = [n.id for n in nodes]
    length, path = longest_path(ids, dur, Successors.of(len(nodes), src, dst))
    return length, [ids[k] for k in path]


class Successors(msgspec.Struct):
    """Each node's successors (positions), in the order their edges were given: `first[k]` is node k's one
    successor, -1 for none, `SEVERAL` when it has more, listed in `several[k]` (most nodes have one: a thread's
    chain, read without a list of its own); `indeg`: each node's number of predecessors."""

    first: list[int]
    several: dict[int, list[int]]
    indeg: list[int]

    @classmethod
    def of(cls, n: int, src: Sequence[int], dst: Sequence[int]) -> Successors:
        """The successors of n nodes from their edges as two parallel sequences of positions."""
        succ = cls([-1] * n, {}, [0] * n)
        first, several, indeg = succ.first, succ.several, succ.indeg
        for s, d in zip(src, dst, strict=True):
            indeg[d] += 1
            f = first[s]
            if f == -1:
                first[s] = d
            elif f >= 0:
                several[s] = [f, d]
                first[s] = SEVERAL
            else:
                several[s].append(d)
        return succ


SEVERAL = -2  # Successors.first: the node's successors are in Successors.several


def longest_path(ids: Sequence[int], dur: Sequence[float], succ: Successors) -> tuple[float, list[int]]:
    """The critical path over nodes given by position: each node's id and duration, and the successors
    (`succ.indeg` is used up). Its length and its nodes' positions, first to last; of paths ending at once, the
    one ending at the smallest id."""
    if not ids:
        return 0.0, []
    start, decided = _longest_starts(dur, succ)
    # the ends twice over, not held: a float each is 5 MB on a trace of 224k nodes
    latest = max(map(operator.add, start, dur))
    last = min((ids[k], k) for k in itertools.compress(range(len(dur)), map(
        operator.eq, map(operator.add, start, dur), itertools.repeat(latest))))[1]
    del start
    path: list[int] = []
    append, k = path.append, last
    while k >= 0:
        append(k)
        k = decided[k]
    path.reverse()
    return latest, path


def _longest_starts(dur: Sequence[float], succ: Successors) -> tuple[list[float], list[int]]:
    """Each node's latest predecessor end (unlimited resources), and the predecessor that decided it (-1: none):
    nodes in Kahn's order, the last made ready first; of predecessors ending at once, the first taken decides."""
    start = [0.0] * len(dur)
    decided = [-1] * len(dur)  # the predecessor whose end decided a node's start
    indeg, first, several = succ.indeg, succ.first, succ.several
    ready = list(itertools.compress(range(len(indeg)), map(operator.not_, indeg)))  # (no predecessor)
    pop, push = ready.pop, ready.append
    while ready:
        k = pop()
        while True:
            end = start[k] + dur[k]
            j = first[k]
            if j < 0:
                if j == SEVERAL:
                    for j in several[k]:
                        # a start no predecessor set is 0.0 and undecided: the first end at or after 0 sets it
                        if end > start[j] if decided[j] >= 0 else end >= 0.0:
                            start[j] = end
                            decided[j] = k
                        left = indeg[j] - 1
                        indeg[j] = left
                        if not left:
                            push(j)
                break
            # one successor (most nodes: a thread's chain); once ready, it would be pushed and popped at once (the
            # last pushed), so it is taken next here
            if end > start[j] if decided[j] >= 0 else end >= 0.0:
                start[j] = end
                decided[j] = k
            left = indeg[j]
            if left != 1:  # (predecessors left to take: not ready; its count is read no more once it is)
                indeg[j] = left - 1
                break
            k = j
    return start, decided


def delay_share(nodes: Sequence[PathNode]) -> DelayShare:
    """The share of the critical path (unlimited resources) in nodes that stand for no measured op: idle and
    GPU-idle delays, wake-up latency, untraced work. The rank start offset is an initial condition, kept apart.
    The report (etweave.report) and bench/replay.py both use this one function."""
    cp, path = critical_path(nodes)
    by_id = {n.id: n for n in nodes}
    return share_of_path(cp, [by_id[i] for i in path])


def share_of_path(cp: float, path: Sequence[PathNode]) -> DelayShare:
    """`delay_share` of a critical path already found (`cp` µs long; only its nodes' name, kind and duration are
    read)."""
    by_kind: dict[str, float] = {}
    offset = 0.0
    for n in path:
        if n.name == RANK_START_OFFSET:
            offset += n.duration
        elif n.kind in NO_OP_KINDS:
            by_kind[n.kind] = by_kind.get(n.kind, 0.0) + n.duration
    base = cp - offset
    share = 100.0 * sum(by_kind.values()) / base if base > 0 else 0.0
    return DelayShare(cp, share, offset, dict(sorted(by_kind.items())), [n.id for n in path])


class SyncBlocking(NamedTuple):
    """µs CPU threads spent blocked in GPU syncs: in all, while the device ran GPU ops, and of that the part while
    it ran a collective kernel (a collective's kernel also waits for its peers: faster GPUs do not shorten that)."""

    blocked: float
    while_busy: float
    while_collective: float


def blocked_in_gpu_syncs(g: Graph) -> SyncBlocking:
    """From each blocking call's start to the end of the GPU op it waited for; `while_busy` is what faster GPU ops
    could shorten (a pageable copy's staging, with the GPU idle, is not)."""
    busy: dict[int | None, list[tuple[float, float, bool]]] = {}
    for it in g.items:
        if it.kind in GPU_KINDS:
            busy.setdefault(it.device, []).append((it.start, it.start + it.dur, it.comm is not None))
    for spans in busy.values():
        spans.sort()
    blocked = while_busy = while_collective = 0.0
    for it in g.items:
        for a in it.awaits:
            if a.evidence is not Evidence.SYNC or it.part_of is None:
                continue
            awaited, call = g.by_id[a.item], g.by_id[it.part_of]
            lo, hi = call.start, min(awaited.start + awaited.dur, call.start + call.dur)
            blocked += max(0.0, hi - lo)
            cur = lo
            for s0, e0, collective in busy.get(awaited.device, []):
                s1, e1 = max(s0, cur), min(e0, hi)
                if e1 > s1:
                    while_busy += e1 - s1
                    while_collective += (e1 - s1) if collective else 0.0
                    cur = e1
    return SyncBlocking(blocked, while_busy, while_collective)
