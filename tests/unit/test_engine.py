"""The replay engine on hand-built RankGraphs: timing of a chain, resource order, a collective across two ranks,
send/recv, a diagnosed deadlock and the inputs it refuses."""

from __future__ import annotations

import pytest

from etweave.simulate.engine import COLL, RECV, SEND, GraphError, RankGraph, SimNode, UnknownGroup, replay

COMP = 4  # Chakra COMP_NODE


def comp(nid: int, duration: int, deps: tuple[int, ...] = (), resource: str | None = "gpu0:s7") -> SimNode:
    return SimNode(nid, f"op{nid}", COMP, deps, duration, resource)


def coll(nid: int, duration: int, deps: tuple[int, ...] = (), pg: str = "") -> SimNode:
    return SimNode(nid, f"allreduce{nid}", COLL, deps, duration, "gpu0:nccl", pg=pg)


def send(nid: int, src: int, dst: int, duration: int, deps: tuple[int, ...] = (), tag: int = 0) -> SimNode:
    return SimNode(nid, f"send{nid}", SEND, deps, duration, None, comm_src=src, comm_dst=dst, comm_tag=tag)


def recv(nid: int, src: int, dst: int, duration: int, deps: tuple[int, ...] = (), tag: int = 0) -> SimNode:
    return SimNode(nid, f"recv{nid}", RECV, deps, duration, None, comm_src=src, comm_dst=dst, comm_tag=tag)


def test_chain_runs_back_to_back_and_is_the_critical_path() -> None:
    out = replay([RankGraph(0, [comp(1, 3), comp(2, 4, (1,)), comp(3, 5, (2,))])], {})
    assert out.start == [[0, 3, 7]]
    assert out.end == [[3, 7, 12]]
    assert out.makespan == 12
    assert out.critical_path == [(0, 0), (0, 1), (0, 2)]
    assert out.contribution == [3, 4, 5]
    assert out.stuck_count == 0 and out.notes == []


def test_ready_nodes_share_a_resource_lowest_id_first() -> None:
    # 2 and 3 are both ready at 0 on one stream: 2 (lower id) runs first; 4 takes no resource and runs at once
    out = replay([RankGraph(0, [comp(3, 5), comp(2, 2), comp(4, 1, resource=None)])], {})
    assert out.issue == [[2, 0, 0]]
    assert out.end == [[7, 2, 1]]
    assert out.critical_path == [(0, 1), (0, 0)]  # 3 waited for 2's stream
    assert out.contribution == [2, 5]


def test_collective_starts_on_every_member_at_the_last_arrival() -> None:
    rank0 = RankGraph(0, [coll(1, 4)])
    rank1 = RankGraph(1, [comp(1, 6), coll(2, 3, (1,))])
    out = replay([rank0, rank1], {})
    assert out.issue == [[0], [0, 6]]
    assert out.start == [[6], [0, 6]]
    assert out.end == [[10], [6, 9]]  # each member ends after its own duration
    assert [(c.pg, c.seq, c.members, c.nodes) for c in out.collectives] == [("", 0, [0, 1], [(0, 0), (1, 1)])]
    assert out.critical_path == [(1, 0), (0, 0)]  # rank 1's op delayed the collective, rank 0's copy ends last


def test_kth_collective_of_a_group_matches_by_ascending_id() -> None:
    rank0 = RankGraph(0, [coll(7, 1, pg="1"), coll(3, 1, pg="1")])
    rank1 = RankGraph(1, [coll(5, 1, pg="1"), coll(9, 1, pg="1")])
    out = replay([rank0, rank1], {"1": [0, 1]})
    assert [c.nodes for c in out.collectives] == [[(0, 1), (1, 0)], [(0, 0), (1, 1)]]


def test_recv_ends_with_the_later_of_itself_and_its_send() -> None:
    rank0 = RankGraph(0, [comp(1, 5), send(2, 0, 1, 3, (1,))])
    rank1 = RankGraph(1, [recv(1, 0, 1, 2), comp(2, 1, (1,))])
    out = replay([rank0, rank1], {})
    assert out.start == [[0, 5], [0, 8]]
    assert out.end == [[5, 8], [8, 9]]  # the recv started at 0 but its message left at 5 and took 3
    assert out.critical_path == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert out.contribution == [5, 3, 0, 1]


def test_send_whose_peer_is_not_given_runs_alone() -> None:
    out = replay([RankGraph(0, [send(1, 0, 3, 4), recv(2, 5, 0, 2)])], {})
    assert out.end == [[4, 2]]
    assert out.notes == ["2 send/recv nodes have their peer rank outside the files given: replayed alone"]


def test_deadlock_is_diagnosed_root_causes_first() -> None:
    # rank 0 issues a collective that rank 1 never issues; rank 1 waits for a message rank 0 never sends
    rank0 = RankGraph(0, [coll(1, 2), comp(2, 1, (1,))])
    rank1 = RankGraph(1, [recv(1, 0, 1, 1), comp(2, 1, (1,))])
    out = replay([rank0, rank1], {})
    assert out.stuck_count == 4
    assert [(s.rank, s.node_id) for s in out.stuck] == [(0, 1), (1, 1), (0, 2), (1, 2)]
    assert out.stuck[0].waits_for == ("collective #0 of pg '' issued at 0 us, waits for rank 1, which never issues "
                                      "it (it has 0 collectives of that pg)")
    assert out.stuck[1].waits_for == "recv #0 from rank 0 tag 0: rank 0 never sends it (0 matching sends)"
    assert out.stuck[2].waits_for == "waits for 1 unfinished deps: 1"
    assert out.critical_path == [] and out.end[0] == [-1, -1]


def test_resource_held_by_a_blocked_collective_is_diagnosed() -> None:
    # the collective holds the nccl stream while it waits for rank 1, so node 2 (ready) can never take it
    rank0 = RankGraph(0, [coll(1, 2), SimNode(2, "other", COMP, (), 1, "gpu0:nccl")])
    rank1 = RankGraph(1, [comp(1, 1, (2,)), comp(2, 1, (1,))])  # a cycle: never issues anything
    out = replay([rank0, rank1], {})
    waits = {(s.rank, s.node_id): s.waits_for for s in out.stuck}
    assert waits[(0, 2)] == "ready at 0 us, waits for gpu0:nccl, held by node 1 (itself blocked)"
    assert waits[(0, 1)].endswith("waits for rank 1, which never issues it (it has 0 collectives of that pg)")


@pytest.mark.parametrize(("ranks", "groups", "error", "message"), [
    ([RankGraph(0, []), RankGraph(0, [], "b.et")], {}, GraphError, "rank 0 given more than once (also graph #0)"),
    ([RankGraph(0, [comp(1, 1, (9,))])], {}, GraphError, "node 1 depends on node 9, which is not in the file"),
    ([RankGraph(0, [comp(1, 1), comp(1, 1)])], {}, GraphError, "node id 1 appears twice"),
    ([RankGraph(0, [coll(4, 1, pg="3")])], {}, UnknownGroup,
     "collective node 4 uses pg_name '3', which the comm-group map does not list"),
    ([RankGraph(2, [coll(4, 1, pg="1")])], {"1": [0, 1]}, GraphError,
     "rank 2 issues collectives of pg '1', whose members are [0, 1]"),
    ([RankGraph(0, [send(1, 1, 0, 1)])], {}, GraphError, "node 1 has comm_src 1 but the file is rank 0"),
])
def test_inconsistent_graphs_are_refused(ranks: list[RankGraph], groups: dict[str, list[int]],
                                         error: type[GraphError], message: str) -> None:
    with pytest.raises(error) as caught:
        replay(ranks, groups)
    assert caught.value.problem == message
    assert caught.value.rank_index == len(ranks) - 1


def test_group_members_absent_from_the_files_are_noted() -> None:
    out = replay([RankGraph(0, [coll(1, 2, pg="1")])], {"1": [0, 4]})
    assert out.notes == ["pg '1': members [4] are not among the files given: ignored"]
    assert out.end == [[2]]
