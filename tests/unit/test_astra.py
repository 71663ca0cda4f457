"""simulate/astra.py: ASTRA-sim's issue rules (docs/FACTS.md §A2, §A4) on graphs of a few nodes."""

from __future__ import annotations

from array import array

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.simulate.astra import AstraNode, AstraRank, _fill, replicate, simulate, simulate_timings
from etweave.simulate.engine import GraphError
from etweave.simulate.network import DEFAULT_NETWORK


def comp(id: int, us: int, *deps: int, cpu: bool = True) -> AstraNode:
    return AstraNode(id=id, name=f"n{id}", type=pb.COMP_NODE, deps=deps, duration_us=us, is_cpu_op=cpu)


def coll(id: int, *deps: int, pg: str = "", size: int = 0, us: int = 0) -> AstraNode:
    return AstraNode(id=id, name=f"c{id}", type=pb.COMM_COLL_NODE, deps=deps, duration_us=us, is_cpu_op=False,
                     comm_type=pb.ALL_REDUCE, comm_size=size, pg=pg)


def test_one_cpu_slot_serializes_threads() -> None:
    rank = AstraRank(0, [comp(1, 10), comp(2, 20), comp(3, 5, cpu=False)])
    with_slots = simulate(replicate(rank, 2), {})
    assert with_slots.finished_ns == [30_000, 30_000]  # 1 then 2 on the CPU slot; 3 beside them on the GPU slot
    assert with_slots.slot_wait_ns[0] == [10_000, 0, 0]
    assert simulate(replicate(rank, 2), {}, slots=False).makespan_ns == 20_000


def test_zero_duration_lasts_one_ns() -> None:
    assert simulate(replicate(AstraRank(0, [comp(1, 0)]), 2), {}).makespan_ns == 1


def test_collective_starts_when_the_last_member_issued_it() -> None:
    ranks = [AstraRank(0, [comp(1, 10), coll(2, 1, us=1)]), AstraRank(1, [comp(1, 30), coll(2, 1, us=1)])]
    run = simulate(ranks, {}, collectives="network")  # comm_size 0: the network makes it free
    assert run.finished_ns == [30_000, 30_000]
    run = simulate(ranks, {}, collectives="duration")
    assert run.finished_ns == [31_000, 31_000]


def test_send_and_recv_meet() -> None:
    send = AstraNode(id=2, name="s", type=pb.COMM_SEND_NODE, deps=(1,), duration_us=4, is_cpu_op=False,
                     comm_src=0, comm_dst=1, comm_tag=0)
    recv = AstraNode(id=1, name="r", type=pb.COMM_RECV_NODE, deps=(), duration_us=1, is_cpu_op=False,
                     comm_src=0, comm_dst=1, comm_tag=0)
    run = simulate([AstraRank(0, [comp(1, 10), send]), AstraRank(1, [recv])], {}, collectives="duration")
    assert run.finished_ns == [14_000, 14_000] and run.notes == []


def test_a_peer_outside_the_npus_given_runs_alone() -> None:
    send = AstraNode(id=2, name="s", type=pb.COMM_SEND_NODE, deps=(), duration_us=4, is_cpu_op=False,
                     comm_src=0, comm_dst=1, comm_tag=0)
    run = simulate(replicate(AstraRank(0, [send]), 2), {}, collectives="duration")
    assert run.notes == ["2 send/recv nodes have no peer among the NPUs given: replayed alone"]


def test_a_stuck_collective_is_named() -> None:
    ranks = [AstraRank(0, [coll(1, pg="5")]), AstraRank(1, [comp(1, 1)])]
    run = simulate(ranks, {"5": [0, 1]})
    assert run.finished_ns == [None, 1000] and run.stuck_count == 1
    assert run.stuck == ["rank 0 node 1 'c1': issued, waits for its peers"]


@pytest.mark.parametrize(("ranks", "groups", "message"), [
    ([AstraRank(0, [comp(1, 1)]), AstraRank(0, [comp(1, 1)])], {}, "more than once"),
    ([AstraRank(0, [comp(1, 1, 9)]), AstraRank(1, [])], {}, "depends on node 9"),
    ([AstraRank(0, [coll(1, pg="7")]), AstraRank(1, [])], {}, "does not list"),
    ([AstraRank(0, [coll(1, pg="7")]), AstraRank(1, [])], {"7": [1]}, "issues collectives of pg '7'"),
])
def test_graphs_it_cannot_run(ranks: list[AstraRank], groups: dict[str, list[int]], message: str) -> None:
    with pytest.raises(GraphError, match=message):
        simulate(ranks, groups)


def test_file_order_does_not_change_the_replay() -> None:
    """The model indexes each rank's nodes in id order (its ready nodes then order by index alone): a rank whose
    file lists them in another order replays the same, equal-time events and slot waits included."""
    nodes = [comp(1, 10), comp(2, 5, 1), comp(3, 5, 1, cpu=False), comp(4, 0, 2, 3), coll(5, 4, us=3),
             comp(6, 7, cpu=False), comp(7, 2, 5, 6)]
    in_order = [AstraRank(0, nodes), AstraRank(1, nodes)]
    shuffled = [AstraRank(0, [nodes[i] for i in (6, 2, 0, 4, 3, 5, 1)]), AstraRank(1, nodes[::-1])]
    for collectives in ("network", "duration"):
        a, b = simulate(in_order, {}, collectives=collectives), simulate(shuffled, {}, collectives=collectives)
        assert (a.finished_ns, a.slot_wait_ns, a.blocked_by) == (b.finished_ns, b.slot_wait_ns, b.blocked_by)
        assert a.finished_ns[0] is not None and a.finished_ns[0] > 0
    stuck = simulate([AstraRank(0, [comp(3, 1, 2), coll(2, pg="5"), comp(1, 1)]), AstraRank(1, [comp(1, 1)])],
                     {"5": [0, 1]})  # the nodes named from their place in the file
    assert stuck.stuck == ["rank 0 node 2 'c2': issued, waits for its peers", "rank 0 node 3 'n3': waits for its deps"]


def test_times_past_machine_ints_still_replay() -> None:
    """Times are kept as machine ints while they fit: a duration no real run has (2^60 µs, past 2^63 ns) replays
    the same on Python ints."""
    run = simulate(replicate(AstraRank(0, [comp(1, 1 << 60), comp(2, 1, 1)]), 2), {})
    assert run.finished_ns == [(1 << 60) * 1000 + 1000] * 2 and run.stuck_count == 0


def test_contention_off_replays_the_same_without_its_breakdown() -> None:
    """`contention=False` (what `etweave simulate` asks for) skips only the blocked-by breakdown: every other
    result, stuck nodes included, is the same as with it."""
    nodes = [comp(1, 10), comp(2, 5, 1), comp(3, 20), comp(4, 5, cpu=False), coll(5, 2, 4, us=3), comp(6, 1, 5)]
    ranks = [AstraRank(0, nodes), AstraRank(1, [*nodes[:4], coll(5, 2, 4, us=9)])]
    for collectives in ("network", "duration"):
        on, off = (simulate(ranks, {}, collectives=collectives, contention=c) for c in (True, False))
        assert sum(ns for blocked in on.blocked_by for ns in blocked.values()) > 0  # node 3 waited behind 1, 2
        assert off.blocked_by == [{}, {}]
        assert (off.finished_ns, off.slot_wait_ns, off.stuck, off.stuck_count) == (
            on.finished_ns, on.slot_wait_ns, on.stuck, on.stuck_count)
    stuck = [AstraRank(0, [comp(3, 1, 2), coll(2, pg="5"), comp(1, 1)]), AstraRank(1, [comp(1, 1)])]
    on, off = (simulate(stuck, {"5": [0, 1]}, contention=c) for c in (True, False))
    assert off.stuck == on.stuck and off.stuck_count == on.stuck_count == 2 and off.finished_ns == [None, 1000]


def test_runs_in_one_call_replay_as_each_alone() -> None:
    """`simulate_timings` reuses one run's columns for the next (reset in place): each run, of a graph that
    finishes and of one that never does, is the run `simulate` gives alone."""
    nodes = [comp(1, 10), comp(2, 5, 1), comp(3, 20), comp(4, 5, cpu=False), coll(5, 2, 4, us=3, size=1 << 20),
             comp(6, 1, 5)]
    send = AstraNode(id=7, name="s", type=pb.COMM_SEND_NODE, deps=(6,), duration_us=4, is_cpu_op=False,
                     comm_size=1 << 20, comm_src=0, comm_dst=1, comm_tag=0)
    recv = AstraNode(id=7, name="r", type=pb.COMM_RECV_NODE, deps=(), duration_us=1, is_cpu_op=False,
                     comm_size=1 << 20, comm_src=0, comm_dst=1, comm_tag=0)  # issued at 0, long before its send
    ranks = [AstraRank(0, [*nodes, send]),
             AstraRank(1, [*nodes[:4], coll(5, 2, 4, us=9, size=1 << 20), comp(6, 4, 5), recv])]
    stuck = [AstraRank(0, [comp(3, 1, 2), coll(2, pg="5"), comp(1, 1)]), AstraRank(1, [comp(1, 1)])]
    for graph, groups in ((ranks, {}), (stuck, {"5": [0, 1]})):
        timings = ("network", "duration", "network")
        together = simulate_timings(graph, groups, DEFAULT_NETWORK, timings)
        alone = [simulate(graph, groups, collectives=c) for c in timings]
        assert [(r.finished_ns, r.slot_wait_ns, r.blocked_by, r.stuck, r.stuck_count) for r in together] == [
            (r.finished_ns, r.slot_wait_ns, r.blocked_by, r.stuck, r.stuck_count) for r in alone]
    network, duration, _ = simulate_timings(ranks, {}, DEFAULT_NETWORK, ("network", "duration", "network"))
    assert network.finished_ns != duration.finished_ns  # the runs differ: a reused column left as it was would show


def test_fill_sets_every_item_in_place() -> None:
    for size in (0, 1, 2, 3, 7, 8, 1000):
        column = array("q", range(size))
        before = column.buffer_info()[0]
        _fill(column, -1)
        assert list(column) == [-1] * size and column.buffer_info()[0] == before
