"""fidelity.py: the critical path with unlimited resources, and the share of it no measured op explains."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

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


def _critical_path_by_offsets(nodes: list[PathNode]) -> tuple[float, list[int]]:
    """The rule as first written (successors in one offsets array, every edge relaxed alike): Kahn's order, the
    last made ready first; a start taken from a later predecessor only if it ends later, or at once while no
    predecessor has decided it."""
    index = {n.id: k for k, n in enumerate(nodes)}
    succ: list[list[int]] = [[] for _ in nodes]
    indeg = [0] * len(nodes)
    for k, n in enumerate(nodes):
        for p in n.preds:
            succ[index[p]].append(k)
            indeg[k] += 1
    start, decided = [0.0] * len(nodes), [-1] * len(nodes)
    ready = [k for k in range(len(nodes)) if not indeg[k]]
    while ready:
        k = ready.pop()
        end = start[k] + nodes[k].duration
        for j in succ[k]:
            if end > start[j] or (end == start[j] and decided[j] < 0):
                start[j], decided[j] = end, k
            indeg[j] -= 1
            if not indeg[j]:
                ready.append(j)
    if not nodes:
        return 0.0, []
    ends = [s + n.duration for s, n in zip(start, nodes, strict=True)]
    last = min((nodes[k].id, k) for k in range(len(nodes)) if ends[k] == max(ends))[1]
    path = [last]
    while decided[path[-1]] >= 0:
        path.append(decided[path[-1]])
    return max(ends), [nodes[k].id for k in reversed(path)]


@settings(deadline=None, max_examples=300)  # (no timing in tests: a loaded host must not fail it)
@given(st.integers(0, 16), st.data())
def test_critical_path_is_the_rule_as_first_written(n: int, data: st.DataObject) -> None:
    # durations with ties, zeros and negatives (what-if durations), edges along a random order, duplicates too
    order = data.draw(st.permutations(range(n)))
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, b in itertools.combinations(order, 2):
        for _ in range(data.draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
            preds[b].append(a)
    nodes = [PathNode(k, "n", "host_op", data.draw(st.sampled_from([-2.0, 0.0, 1.0, 1.0, 3.0, 4.5])),
                      tuple(preds[k])) for k in range(n)]
    assert critical_path(nodes) == _critical_path_by_offsets(nodes)
