"""fidelity.py: the critical path with unlimited resources, and the share of it no measured op explains."""

from __future__ import annotations

from etweave.fidelity import PathNode, critical_path, delay_share


def test_critical_path_follows_the_longest_chain() -> None:
    nodes = [PathNode(1, "a", "host_op", 5.0, ()), PathNode(2, "b", "delay", 10.0, (1,)),
             PathNode(3, "c", "host_op", 3.0, (1,)), PathNode(4, "d", "kernel", 2.0, (2, 3))]
    assert critical_path(nodes) == (17.0, [1, 2, 4])
    assert critical_path(nodes, {2: 1.0}) == (10.0, [1, 3, 4])
    share = delay_share(nodes)
    assert (share.critical_path, share.by_kind, share.on_path) == (17.0, {"delay": 10.0}, [1, 2, 4])
    assert round(share.share, 3) == round(100 * 10 / 17, 3)


def test_empty_graph() -> None:
    assert critical_path([]) == (0.0, [])
