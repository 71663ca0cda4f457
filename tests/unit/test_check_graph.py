"""etweave.check on a conversion's own nodes (`NodeChecker.add_encoded`) and its graph checks' short cut: a graph whose
edges all rise in a key is accepted without a search, and anything else is looked at edge by edge."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etweave.chakra import et_def_pb2 as pb
from etweave.check import (
    NodeChecker,
    RisingKeys,
    Violation,
    _first_parts,
    _graph_violations,
    _keys_rise,
    _keys_rise_in_two,
    _Shapes,
)
from etweave.deps import Dependencies
from etweave.deps.evidence import Evidence
from etweave.model import HOST_OP, KERNEL, Comm, Edge, Graph, Ids, Item
from etweave.nodes import encode_nodes


def _item(nid: int, start: float, kind: str = HOST_OP, comm: Comm | None = None) -> Item:
    return Item(id=nid, kind=kind, name=f"op{nid}", start=start, seg_end=start + 5, measured=True, tid=1,
                device=0 if kind == KERNEL else None, stream=7 if kind == KERNEL else None, comm=comm)


def _checked(items: list[Item], preds: dict[int, list[Edge]], with_order: bool = True) -> list[str]:
    """The rules `Result.encoded_nodes`'s check reports for these items and edges."""
    return [v.rule for v in _violations(items, preds, with_order)]


def _violations(items: list[Item], preds: dict[int, list[Edge]], with_order: bool = True) -> list[Violation]:
    graph = Graph(items=items, by_id={it.id: it for it in items}, ids=Ids(1000))
    checker = NodeChecker("rank 0")
    encoded = encode_nodes(graph, Dependencies(preds=preds))
    list(encoded)
    checker.add_encoded(items, encoded.ids, encoded.data_deps, encoded.in_full)
    assert encoded.ids == [it.id for it in items] and encoded.starts == [it.start for it in items]
    order = [(it.start, it.pos, it.id) for it in items] if with_order else None
    violations = checker.violations(order)
    if order is not None:  # the same keys in two parts, as `Result.encoded_nodes` gives them
        key_of = dict(zip([it.id for it in items], order, strict=True))
        assert checker.violations(RisingKeys([it.start for it in items], key_of.__getitem__)) == violations
    return violations


def _edge(src: int, dst: int) -> Edge:
    return Edge(src, dst, Evidence.THREAD_ORDER)


def test_a_clean_graph_passes_with_edges_against_id_order() -> None:
    # node 2 runs after node 3: its edge goes back in id order but forward in start time
    items = [_item(1, 10), _item(2, 50), _item(3, 20)]
    preds = {3: [_edge(1, 3)], 2: [_edge(3, 2), _edge(1, 2)]}
    assert _checked(items, preds) == [] and _checked(items, preds, with_order=False) == []


def test_a_dangling_dep_a_cycle_and_a_duplicate_id_are_caught() -> None:
    assert _checked([_item(1, 10), _item(2, 20)], {2: [_edge(99, 2)]}) == ["dangling-data-dep"]
    # a cycle goes against every order: some edge of it falls in the key, and the search finds it
    cycle = {1: [_edge(3, 1)], 2: [_edge(1, 2)], 3: [_edge(2, 3)]}
    assert _checked([_item(1, 10), _item(2, 20), _item(3, 30)], cycle) == ["cycle"]
    [duplicate] = _violations([_item(1, 10), _item(1, 20)], {})
    assert duplicate.rule == "duplicate-id" and "('op1', now 'op1')" in duplicate.message  # (names from the items)
    assert _checked([_item(1, 10), _item(2, 20)], {2: [_edge(2, 2)]}) == ["self-edge"]


def test_comm_nodes_are_decoded_and_checked_in_full() -> None:
    """The encoder always writes comm_size; bytes without it (what a bug would write) fail the check."""
    node = pb.Node(id=1, name="nccl:all_reduce", type=pb.COMM_COLL_NODE)
    node.attr.add(name="comm_type").int64_val = pb.ALL_REDUCE
    comm = Comm(pb.COMM_COLL_NODE, "allreduce", pb.ALL_REDUCE, 64)
    checker = NodeChecker("rank 0")
    checker.add_encoded([_item(1, 10, KERNEL, comm)], [1], [()], [node.SerializeToString()])
    [violation] = checker.violations()
    assert violation.rule == "comm-missing-attr" and "comm_size" in violation.message


def _shapes(deps: list[tuple[int, ...]], ids: list[int] | None = None) -> _Shapes:
    shapes = _Shapes()
    for i, node_deps in enumerate(deps):
        shapes.add(ids[i] if ids else i + 1, f"n{i}", node_deps)
    return shapes


def _rise(shapes: _Shapes, keys: list[int] | None = None) -> bool:
    keys = keys if keys is not None else list(range(len(shapes)))
    return _keys_rise(shapes, dict(zip(shapes.ids, keys, strict=True)), keys)


def test_keys_in_two_parts_decide_ties_in_the_first_by_the_whole_key() -> None:
    # (ids 1, 2, 3 at positions 0, 1, 2)
    chain = _shapes([(), (1,), (2,)])
    assert _keys_rise_in_two(chain, {1: 5, 2: 5, 3: 6}, RisingKeys([5, 5, 6], lambda i: (5 + (i - 1) // 2, i)))
    assert _graph_violations(chain, "r", RisingKeys([5, 5, 6], lambda i: (5 + (i - 1) // 2, i))) == []
    # node 2 depends on node 3 at the same first part: the whole key says it falls, so the search decides
    backward = _shapes([(), (3,), (1,)])
    assert not _keys_rise_in_two(backward, {1: 0, 2: 1, 3: 1}, RisingKeys([0, 1, 1], lambda i: (min(i - 1, 1), i)))
    assert _graph_violations(backward, "r", RisingKeys([0, 1, 1], lambda i: (min(i - 1, 1), i))) == []
    cycle = _shapes([(2,), (1,)])
    assert [v.rule for v in _graph_violations(cycle, "r", RisingKeys([0, 0], lambda i: (0, i)))] == ["cycle"]


def test_the_short_cut_takes_edges_that_rise_in_the_key_and_nothing_else() -> None:
    backward = _shapes([(), (3,), (1,)])  # node 2 depends on node 3, after it in node order
    assert not _rise(backward)
    assert _rise(backward, [0, 2, 1])
    assert not _rise(backward, [0, 1, 2])  # an edge that falls in the key: searched, not refused
    assert _graph_violations(backward, "r", [0, 1, 2]) == [] and _graph_violations(backward, "r") == []
    assert not _rise(_shapes([(), (7,)]))  # a dangling dep
    assert not _rise(_shapes([(), (2,)]))  # a self-edge


def _reference_rules(deps: list[tuple[int, ...]], ids: list[int]) -> set[str]:
    """What the graph checks must find, by brute force: a walk from every node."""
    rules: set[str] = set()
    if len(set(ids)) < len(ids):
        rules.add("duplicate-id")
    first = {nid: i for i, nid in reversed(list(enumerate(ids)))}
    edges: dict[int, list[int]] = {i: [] for i in range(len(ids))}
    for i, node_deps in enumerate(deps):
        for dep in node_deps:
            if dep == ids[i]:
                rules.add("self-edge")
            elif dep not in first:
                rules.add("dangling-data-dep")
            else:
                edges[i].append(first[dep])
    for start in edges:  # a cycle: some node reaches itself
        stack, seen = list(edges[start]), set()
        while stack:
            j = stack.pop()
            if j == start:
                rules.add("cycle")
                break
            if j not in seen:
                seen.add(j)
                stack.extend(edges[j])
    return rules


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.integers(1, n + 1), max_size=3).map(tuple), min_size=n, max_size=n),
    st.lists(st.integers(1, n), min_size=n, max_size=n),
    st.permutations(range(n)))))
def test_the_graph_checks_find_what_a_brute_force_walk_finds(case: tuple[list[tuple[int, ...]], list[int],
                                                                       list[int]]) -> None:
    deps, ids, order = case
    shapes = _shapes(deps, ids)
    expected = _reference_rules(deps, ids)
    # the order's keys also in two parts: a coarse first part (many ties) and the whole (first part, order)
    whole = {nid: (k // 3, k) for nid, k in zip(ids, order, strict=True)}  # (by id: a duplicate is refused first)
    two = RisingKeys([k // 3 for k in order], whole.__getitem__)
    for key in (None, order, two):
        assert {v.rule for v in _graph_violations(shapes, "r", key)} == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.integers(0, 2 * n + 2), max_size=3).map(tuple), min_size=n, max_size=n),
    st.sets(st.integers(0, 2 * n + 1), min_size=n, max_size=n).map(sorted),
    st.permutations(range(n)))))
def test_rising_ids_with_gaps_take_the_list_by_id_and_find_the_same(case: tuple[list[tuple[int, ...]], list[int],
                                                                                  list[int]]) -> None:
    """A conversion's ids rise, with gaps: its first parts are a list by id (`_first_parts`), where a dep into a gap
    or past the last id is dangling, as it is by the dict."""
    deps, ids, order = case
    shapes = _shapes(deps, ids)
    firsts = [k // 3 for k in order]
    listed = _first_parts(ids, firsts)
    assert isinstance(listed, list) and [listed[i] for i in ids] == firsts
    assert {i for i, v in enumerate(listed) if v is not None} <= set(ids)
    whole = {nid: (k // 3, k) for nid, k in zip(ids, order, strict=True)}
    two = RisingKeys(firsts, whole.__getitem__)
    by_dict = dict(zip(ids, firsts, strict=True))
    assert _keys_rise_in_two(shapes, listed, two) == _keys_rise_in_two(shapes, by_dict, two)
    assert {v.rule for v in _graph_violations(shapes, "r", two)} == _reference_rules(deps, ids)


def test_first_parts_by_dict_where_ids_do_not_rise_or_are_sparse_and_none_where_one_repeats() -> None:
    assert _first_parts([3, 1, 2], [0, 1, 2]) == {3: 0, 1: 1, 2: 2}
    assert _first_parts([1, 10**9], [0, 1]) == {1: 0, 10**9: 1}
    assert _first_parts([2, 1, 2], [0, 1, 2]) is None
    assert _first_parts([0, 10, 5], [0, 1, 2]) == {0: 0, 10: 1, 5: 2}
    assert _first_parts([4, -1, 5], [0, 1, 2]) == {4: 0, -1: 1, 5: 2}
    assert _first_parts([1, 3], [5, 6]) == [None, 5, None, 6]


def test_a_conversions_nodes_come_first() -> None:
    """`add_encoded` on a checker that holds nodes already is refused (its names would be out of place); nodes added
    after it keep their names in place."""
    checker = NodeChecker("rank 0")
    checker.add_encoded([_item(1, 10)], [1], [()], [])
    checker.add_to_graph(pb.Node(id=1, name="late"))
    [duplicate] = checker.violations()
    assert "('op1', now 'late')" in duplicate.message
    with pytest.raises(ValueError, match="first"):
        checker.add_encoded([_item(2, 10)], [2], [()], [])
