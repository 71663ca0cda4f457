"""The one matching rule of collectives and send/recv (etweave.matching) on small hand-written inputs."""

from __future__ import annotations

from etweave.matching import collective_instances, group_members, issue_order, match_p2p


def test_group_members_are_the_listed_ranks_present_ascending() -> None:
    assert group_members("", {3, 0, 2}, None) == [0, 2, 3]
    assert group_members("1", {0, 1, 2}, {"1": [2, 0, 5]}) == [0, 2]
    assert group_members("7", {0, 1}, {"1": [0, 1]}) is None
    assert group_members("1", {0, 1}, None) is None


def test_issue_order_is_ascending_node_id() -> None:
    assert issue_order([(9, 0), (2, 1), (5, 2)]) == [(2, 1), (5, 2), (9, 0)]
    assert issue_order([(4, 8, 1), (4, 8, 0)]) == [(4, 8, 0), (4, 8, 1)]  # one id in two files: the rest decides


def test_kth_collective_of_each_member_is_one_instance() -> None:
    sequences = {0: ["a0", "b0", "c0"], 2: ["a2"], 5: ["x5"]}
    # rank 1 has no collective of the group; rank 5 is not a member
    assert list(collective_instances(sequences, [0, 1, 2])) == [
        ["a0", None, "a2"],
        ["b0", None, None],
        ["c0", None, None],
    ]
    assert list(collective_instances({}, [0, 1])) == []


def test_kth_send_matches_kth_recv_on_its_channel() -> None:
    # items are (node id, payload); the payload here names the node: 31 = send 1 ... 41 = recv 1
    sends = {(0, 1, 7): [(30, 33), (10, 31), (20, 32)]}
    recvs = {(0, 1, 7): [(4, 41), (8, 42)], (1, 0, 7): [(2, 50)]}
    matches = list(match_p2p(sends, recvs, {0, 1}))
    assert [m.channel for m in matches] == [(0, 1, 7), (1, 0, 7)]
    first = matches[0]
    assert first.matchable
    assert list(first.pairs) == [((10, 31), (4, 41)), ((20, 32), (8, 42))]
    assert first.unmatched_sends == [(30, 33)] and first.unmatched_recvs == []
    assert matches[1].unmatched_recvs == [(2, 50)] and matches[1].unmatched_sends == []


def test_channel_with_an_end_outside_the_ranks_is_not_matchable() -> None:
    (match,) = match_p2p({(0, 3, 0): [(1, 5)]}, {}, {0, 1})
    assert not match.matchable
    assert match.sends == [(1, 5)]
