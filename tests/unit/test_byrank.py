"""Both replays rank by rank (`etweave.simulate.byrank`) give what the one global order gives: on random graphs of a
few ranks with collectives of the world and of a subgroup, sends and recvs, shared resources and slots, ties,
zero durations and deadlocks; and they stay rank by rank where nothing is ambiguous."""

from __future__ import annotations

import random

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.simulate import byrank
from etweave.simulate.astra import AstraNode, AstraRank, replicate, simulate_timings
from etweave.simulate.engine import COLL, RECV, SEND, GraphError, RankGraph, Replay, SimNode, _EventLoop, replay
from etweave.simulate.network import DEFAULT_NETWORK

SEEDS = range(60)


class Plan:
    """A random job: per rank, its nodes in id order as (kind, duration, deps, resource, peer/pg)."""

    def __init__(self, seed: int, shortest: int, longest: int, deadlock: bool = False) -> None:
        rng = random.Random(seed)
        self.ranks = rng.randint(2, 5)
        self.nodes: list[list[tuple[str, int, tuple[int, ...], int, int | str]]] = [[] for _ in range(self.ranks)]
        world = rng.randint(0, 4)
        pairs = [(a, b) for a in range(self.ranks) for b in range(self.ranks) if a != b]
        messages = [rng.choice(pairs) for _ in range(rng.randint(0, 4))]
        for r in range(self.ranks):
            work: list[tuple[str, int | str]] = [("comp", 0)] * rng.randint(3, 25)
            work += [("coll", "")] * world + [("coll", "1")] * (2 if r < 2 else 0)
            work += [("send", b) for a, b in messages if a == r] + [("recv", a) for a, b in messages if b == r]
            if deadlock and r == 0 and world:
                work.remove(("coll", ""))
            rng.shuffle(work)
            for i, (kind, peer) in enumerate(work):
                deps = tuple(sorted(rng.sample(range(1, i + 1), min(i, rng.randint(0, 2)))))
                self.nodes[r].append((kind, rng.randint(shortest, longest), deps, rng.randint(0, 2), peer))
        # the collectives and the messages keep their order on every rank (as a real job's do): a chain each
        for nodes in self.nodes:
            last: dict[str, int] = {}
            for i, (kind, dur, deps, res, peer) in enumerate(nodes, 1):
                key = f"{kind}{peer}" if kind != "comp" else ""
                if key in last and last[key] not in deps:
                    nodes[i - 1] = (kind, dur, (*deps, last[key]), res, peer)
                if key:
                    last[key] = i

    def sim_ranks(self) -> list[RankGraph]:
        out = []
        for r, nodes in enumerate(self.nodes):
            sim = []
            for i, (kind, dur, deps, res, peer) in enumerate(nodes, 1):
                if kind == "comp":
                    sim.append(SimNode(i, f"op{i}", 4, deps, dur, None if res == 2 else f"s{res}"))
                elif kind == "coll":
                    sim.append(SimNode(i, f"ar{i}", COLL, deps, dur, "nccl", pg=str(peer)))
                else:
                    src, dst = (r, int(peer)) if kind == "send" else (int(peer), r)
                    sim.append(SimNode(i, f"{kind}{i}", SEND if kind == "send" else RECV, deps, dur, None,
                                       comm_src=src, comm_dst=dst, comm_tag=0))
            out.append(RankGraph(r, sim))
        return out

    def astra_ranks(self) -> list[AstraRank]:
        out = []
        for r, nodes in enumerate(self.nodes):
            astra = []
            for i, (kind, dur, deps, res, peer) in enumerate(nodes, 1):
                if kind == "comp":
                    astra.append(AstraNode(i, f"op{i}", pb.COMP_NODE, deps, dur, res == 0))
                elif kind == "coll":
                    astra.append(AstraNode(i, f"ar{i}", pb.COMM_COLL_NODE, deps, dur, False, pb.ALL_REDUCE,
                                           dur * 1000, str(peer)))
                else:
                    src, dst = (r, int(peer)) if kind == "send" else (int(peer), r)
                    astra.append(AstraNode(i, f"{kind}{i}", pb.COMM_SEND_NODE if kind == "send" else
                                           pb.COMM_RECV_NODE, deps, dur, False, None, dur * 100, "", src, dst, 0))
            out.append(AstraRank(r, astra))
        return out

    def groups(self) -> dict[str, list[int]]:
        return {"1": [0, 1]}


def _fields(out: Replay) -> tuple[object, ...]:
    return (out.issue, out.start, out.end, out.makespan, out.critical_path, out.contribution, out.stuck_count,
            out.stuck, out.notes)


@pytest.mark.parametrize("shortest, longest, deadlock", [(1, 1_000_000, False), (0, 3, False), (1, 50, True)])
def test_default_replay_by_rank_is_the_global_order(shortest: int, longest: int, deadlock: bool) -> None:
    kept = stuck = 0
    for seed in SEEDS:
        plan = Plan(seed, shortest, longest, deadlock)
        by_rank = replay(plan.sim_ranks(), plan.groups())
        assert _fields(by_rank) == _fields(replay(plan.sim_ranks(), plan.groups(), by_rank=False)), seed
        kept += by_rank.by_rank
        stuck += by_rank.stuck_count > 0
        if shortest > 0 and not by_rank.stuck_count:
            # nothing ends at the time it is decided: rank by rank tells the global order everywhere
            assert by_rank.by_rank, seed
    if shortest == 0:
        assert 0 < kept < len(SEEDS)  # zero durations: some runs start again in the global order, some need not
    if deadlock:
        assert stuck > len(SEEDS) // 2  # (and those diagnosed alike: `stuck` compared above)


@pytest.mark.parametrize("shortest, longest, deadlock", [(1, 1_000_000, False), (0, 3, False), (1, 50, True)])
@pytest.mark.parametrize("timing", ["network", "duration"])
def test_astra_replay_by_rank_is_the_global_order(shortest: int, longest: int, deadlock: bool, timing: str) -> None:
    kept = finished = 0
    for seed in SEEDS:
        plan = Plan(seed, shortest, longest, deadlock)
        runs = [simulate_timings(plan.astra_ranks(), plan.groups(), DEFAULT_NETWORK, (timing,), contention=True,
                                 by_rank=by_rank)[0] for by_rank in (True, False)]
        a, b = ((r.finished_ns, r.slot_wait_ns, r.blocked_by, r.stuck, r.stuck_count) for r in runs)
        assert a == b, seed
        if not runs[0].stuck_count:
            finished += 1
            kept += runs[0].by_rank
    if longest > 1000:  # ties are rare in ns: (nearly) every run that finishes stays rank by rank
        assert finished > 0 and kept >= finished - 2


def test_ranks_that_keep_waiting_on_each_other_replay_in_the_global_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its stall budget a replay starts again in the global order: the same result, `by_rank` false. (Each
    stall costs a pass over the ranks; the budget keeps them from growing as ranks × stalls.)"""
    plans = [Plan(seed, 1, 1_000_000) for seed in SEEDS]
    stalled = [p for p in plans if _stalls(p) > 0]
    assert len(stalled) > len(SEEDS) // 4  # the random jobs do stall
    monkeypatch.setattr(byrank, "MAX_STALLS", -1 << 40)  # no stall allowed
    for plan in stalled:
        fell_back = replay(plan.sim_ranks(), plan.groups())
        assert not fell_back.by_rank
        assert _fields(fell_back) == _fields(replay(plan.sim_ranks(), plan.groups(), by_rank=False))
        runs = [simulate_timings(plan.astra_ranks(), plan.groups(), DEFAULT_NETWORK, ("network",), by_rank=by_rank)[0]
                for by_rank in (True, False)]
        assert not runs[0].by_rank
        assert runs[0].finished_ns == runs[1].finished_ns and runs[0].stuck == runs[1].stuck


def _stalls(plan: Plan) -> int:
    stalls = []
    real_stall = byrank.RankByRank._stall

    def counting(self: byrank.RankByRank) -> bool:
        stalls.append(1)
        return real_stall(self)

    byrank.RankByRank._stall = counting  # type: ignore[method-assign]
    try:
        replay(plan.sim_ranks(), plan.groups())
    finally:
        byrank.RankByRank._stall = real_stall  # type: ignore[method-assign]
    return len(stalls) - 1  # the last call finds no event left


def test_many_pending_collectives_cost_a_few_bounds_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that issues hundreds of collectives at once (async, on no stream) has them all pending; its horizon
    at each decision comes from a heap of their earliest ends, not a scan of them (which made 2000 pending
    collectives on 16 ranks take 19 s against the global order's 0.3)."""
    nranks, ncoll = 8, 300

    def job() -> list[RankGraph]:
        return [RankGraph(r, [_op(1, 10 + r), *(SimNode(2 + i, f"ar{i}", COLL, (1,), 5 + (7 * i + r) % 13, None,
                                                         pg="0") for i in range(ncoll))]) for r in range(nranks)]

    groups = {"0": list(range(nranks))}
    calls = []
    earliest_end = _EventLoop._earliest_end

    def counted(self: _EventLoop, g: int) -> int:
        calls.append(g)
        return earliest_end(self, g)

    monkeypatch.setattr(_EventLoop, "_earliest_end", counted)
    out = replay(job(), groups)
    assert out.by_rank and not out.stuck_count
    assert len(calls) < 4 * nranks * ncoll  # a scan per decision: about nranks * ncoll² / 2
    assert _fields(out) == _fields(replay(job(), groups, by_rank=False))


@pytest.mark.parametrize("seed", [878, 1253])
def test_a_recv_and_its_send_issued_at_one_time_on_two_ranks_order_as_the_global_order(seed: int) -> None:
    """Found by search: jobs where a send and its recv issue at the same time on two ranks and the recv's end
    ties with another event of its rank (durations of 1-3). Only the rank that issued the later of the two, the
    other strictly before, decides the recv's end as the global order does (`RankByRank.recv_decided_here`)."""
    plan = Plan(seed, 1, 3)
    runs = [simulate_timings(plan.astra_ranks(), plan.groups(), DEFAULT_NETWORK, ("duration",), by_rank=by_rank)[0]
            for by_rank in (True, False)]
    a, b = ((r.finished_ns, r.slot_wait_ns, r.blocked_by, r.stuck, r.stuck_count) for r in runs)
    assert a == b


def test_one_rank_replays_in_the_global_order() -> None:
    plan = Plan(5, 1, 100)
    one = plan.sim_ranks()[:1]
    for nd in one[0].nodes:  # alone: every comm node runs on its own
        nd.type, nd.pg = 4, None
    assert not replay(one, {}).by_rank


def _op(nid: int, dur: int, deps: tuple[int, ...] = (), res: str | None = "s0") -> SimNode:
    return SimNode(nid, f"op{nid}", 4, deps, dur, res)


def _coll(nid: int, dur: int, deps: tuple[int, ...] = ()) -> SimNode:
    return SimNode(nid, f"ar{nid}", COLL, deps, dur, "nccl", pg="")


def test_the_last_member_to_issue_at_one_time_is_the_global_orders_last() -> None:
    # both members issue the collective at 5; rank 0 only in the second round at 5 (after a zero-length op), so
    # the global order has rank 0 last, though rank 1 comes after it in rank order: rank 0's cause is the path's
    ranks = [RankGraph(0, [_op(1, 5), _op(2, 0, (1,), "s1"), _coll(3, 4, (2,))]),
             RankGraph(1, [_op(1, 5), _coll(2, 4, (1,))])]
    out = replay(ranks, {})
    assert out.by_rank
    assert _fields(out) == _fields(replay(ranks, {}, by_rank=False))
    assert out.critical_path[:3] == [(0, 0), (0, 1), (0, 2)]


def test_a_collective_ending_when_decided_replays_in_the_global_order() -> None:
    # rank 1 issues the zero-length collective last, at 5, when rank 0's op 1 ends too: the global order ends the
    # collective on rank 0 in a later round at 5 than op 1, so op 4 (readied by op 1) takes the stream before op 3
    # (readied by the collective); rank by rank cannot see those rounds, and starts again in the global order
    ranks = [RankGraph(0, [_op(1, 5), _coll(2, 0), _op(3, 2, (2,)), _op(4, 2, (1,))]),
             RankGraph(1, [_op(1, 5), _coll(2, 0, (1,))])]
    out = replay(ranks, {})
    assert not out.by_rank
    assert out.issue[0] == [0, 0, 7, 5]
    assert _fields(out) == _fields(replay(ranks, {}, by_rank=False))


@pytest.mark.parametrize("shortest, longest, slots", [(1, 1_000_000, True), (0, 3, True), (1, 5, True),
                                                     (1, 5, False)])
@pytest.mark.parametrize("timing", ["network", "duration"])
def test_replicas_of_one_trace_replay_one_of_them_as_every_npu_does(shortest: int, longest: int, slots: bool,
                                                                     timing: str) -> None:
    """A lone trace replayed as several NPUs (`replicate`): the first replayed alone, standing for each, gives what
    replaying every NPU in the global order gives; where ties between a collective's end and another event of the
    NPU could fall either way, every NPU is replayed. (slots=False: every ready node issues at once.)"""
    mirrored = 0
    for seed in SEEDS:
        plan = Plan(seed, shortest, longest)
        lone = plan.astra_ranks()[0]
        npus = 2 + seed % 3
        groups = {"1": list(range(npus))}
        runs = [simulate_timings(replicate(lone, npus), groups, DEFAULT_NETWORK, (timing,), slots, contention=True,
                                 by_rank=by_rank)[0] for by_rank in (True, False)]
        a, b = ((r.finished_ns, r.slot_wait_ns, r.blocked_by, r.stuck, r.stuck_count, r.notes) for r in runs)
        assert a == b, seed
        assert [rg.rank for rg in runs[0].ranks] == list(range(npus))
        mirrored += runs[0].replicas_replayed
    if longest > 1000:  # ties are rare in ns
        assert mirrored >= len(SEEDS) - 2
    elif timing == "duration":  # (network times are longer than these durations: few ties)
        assert 0 < mirrored < len(SEEDS)  # some ties fall back to every NPU, and some need not


def test_replicas_outside_a_collectives_group_are_each_replayed() -> None:
    """A group that leaves out some replicas: those NPUs' replays differ (here: ASTRA-sim refuses the job), so no
    replica stands for another."""
    lone = Plan(3, 1, 100).astra_ranks()[0]
    assert any(nd.pg == "1" for nd in lone.nodes)
    with pytest.raises(GraphError, match="issues collectives of pg '1'"):
        simulate_timings(replicate(lone, 3), {"1": [0, 1]}, DEFAULT_NETWORK, ("network",))


def test_replicas_stuck_on_a_cycle_are_told_as_every_npu_tells_them() -> None:
    """A lone trace with a dependency cycle: its nodes never finish on any NPU. Replayed once for all replicas, the
    stuck count and the first lines are those of every NPU replayed, and thousands of NPUs list only the first."""
    comp = pb.COMP_NODE
    nodes = [AstraNode(1, "a", comp, (), 2, True), AstraNode(2, "b", comp, (1, 3), 2, True),
             AstraNode(3, "c", comp, (2,), 2, True), AstraNode(4, "d", comp, (1,), 2, False),
             AstraNode(5, "e", comp, (3,), 2, False)]
    lone = AstraRank(0, nodes)
    for npus in (2, 3, 5):
        runs = [simulate_timings(replicate(lone, npus), {}, DEFAULT_NETWORK, ("network",), by_rank=by_rank)[0]
                for by_rank in (True, False)]
        assert runs[0].replicas_replayed and not runs[1].replicas_replayed
        assert (runs[0].stuck, runs[0].stuck_count, runs[0].finished_ns) == \
               (runs[1].stuck, runs[1].stuck_count, runs[1].finished_ns)
        assert runs[0].stuck_count == 3 * npus and runs[0].finished_ns == [None] * npus
    many = simulate_timings(replicate(lone, 100_000), {}, DEFAULT_NETWORK, ("network",))[0]
    assert many.stuck_count == 300_000
    assert many.stuck == [f"rank {r} node {n} {name!r}: waits for its deps"
                          for r in range(4) for n, name in ((2, "b"), (3, "c"), (5, "e"))][:10]
