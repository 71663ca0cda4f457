"""The shared indexes of a graph: `Graph.of_kinds`, the waits kept once the waits stage is done, `Ids.take`, and
repair's whole-list test that a trace has no parent cycle."""

from __future__ import annotations

import pytest

from etweave.deps.awaited import awaited
from etweave.deps.evidence import Evidence
from etweave.model import DELAY, GPU_KINDS, HOST_OP, KERNEL, MEMCPY, MEMSET, RUNTIME, Await, Ids, Item
from etweave.periods import Chains
from etweave.read.host_et import IO, HostOp
from etweave.repair import repair
from tests.unit.graphs import graph


def test_take_hands_out_what_as_many_next_calls_would() -> None:
    a, b = Ids(10), Ids(10)
    assert list(a.take(3)) == [b.next() for _ in range(3)] == [10, 11, 12]
    assert a.next() == b.next() == 13
    assert list(a.take(0)) == [] and a.peek() == 14


def test_of_kinds_gives_the_items_of_those_kinds_in_item_order_and_forgets_them_when_one_is_added() -> None:
    g = graph(Item(1, HOST_OP, "op"), Item(2, KERNEL, "k"), Item(3, RUNTIME, "launch"), Item(4, MEMCPY, "copy"))
    assert [it.id for it in g.of_kinds(GPU_KINDS)] == [2, 4]
    g.add(Item(0, DELAY, "[idle]"))  # a period: the index holds
    assert [it.id for it in g.of_kinds(GPU_KINDS)] == [2, 4]
    added = g.add(Item(0, KERNEL, "late"))  # an assembled kind: found again
    assert [it.id for it in g.of_kinds(GPU_KINDS)] == [2, 4, added.id]
    with pytest.raises(AssertionError, match="delay"):
        g.of_kinds(frozenset({DELAY}))  # a kind later stages add and change: no index


def test_of_kinds_merges_the_kinds_assemble_listed_in_item_order_as_a_pass_would() -> None:
    items = [Item(1, HOST_OP, "op"), Item(2, KERNEL, "k"), Item(3, RUNTIME, "launch"), Item(4, MEMCPY, "copy"),
             Item(5, KERNEL, "k2")]
    indexed, passed = graph(*items), graph(*items)
    indexed.index_kinds({HOST_OP: [items[0]], KERNEL: [items[1], items[4]], RUNTIME: [items[2]], MEMCPY: [items[3]]})
    for kinds in (GPU_KINDS, frozenset({KERNEL}), frozenset({HOST_OP, KERNEL}), frozenset({MEMSET})):
        assert indexed.of_kinds(kinds) == passed.of_kinds(kinds)
    assert [it.id for it in indexed.of_kinds(GPU_KINDS)] == [2, 4, 5]
    assert indexed.of_kinds(frozenset({MEMSET})) == []  # a kind assemble made none of: indexed, empty


def test_of_kinds_forgets_an_item_of_its_kinds_that_the_chains_remove() -> None:
    g = graph(Item(1, KERNEL, "k"), Item(2, DELAY, "[idle]"), Item(3, MEMCPY, "copy"))
    assert [it.id for it in g.of_kinds(GPU_KINDS)] == [1, 3]
    chains = Chains(g)
    chains.removed.add(2)  # an idle gap: the index holds
    chains.store()
    assert [it.id for it in g.of_kinds(GPU_KINDS)] == [1, 3] and g.kind_index
    chains = Chains(g)  # (store is once a stage)
    chains.removed.add(3)
    chains.store()
    assert [it.id for it in g.of_kinds(GPU_KINDS)] == [1]


def test_removed_periods_leave_the_items_in_order_whether_or_not_the_items_are_in_id_order() -> None:
    for ids in ([1, 2, 3, 4, 5, 6], [4, 1, 6, 2, 5, 3]):  # (a graph's items are in id order; a pass otherwise)
        g = graph(*(Item(i, DELAY, "[idle]") for i in ids))
        chains = Chains(g)
        chains.removed.update({1, 4, 6})
        chains.store()
        assert [it.id for it in g.items] == [i for i in ids if i not in (1, 4, 6)]
        assert sorted(g.by_id) == [2, 3, 5]


def test_the_wait_sources_read_the_kept_waits_as_a_pass_would() -> None:
    first, second, waiter = Item(1, KERNEL, "a"), Item(2, KERNEL, "b"), Item(3, KERNEL, "c")
    waiter.wait_for(Await(1, Evidence.SYNC, False), Await(2, Evidence.EVENT_WAIT, True))
    g = graph(first, second, waiter)
    passed = awaited(g, Evidence.EVENT_WAIT)
    g.waiting = [waiter]
    assert awaited(g, Evidence.EVENT_WAIT) == passed != []
    g.waiting = []  # what the waits stage kept is what is read
    assert awaited(g, Evidence.EVENT_WAIT) == []


def _op(op_id: int, parent: int, name: str = "op") -> HostOp:
    empty = IO([], [], [])
    return HostOp(id=op_id, name=name, parent=parent, et_tid=1, rf_id=0, seq_id=-1, fw_parent=0, fw_tid=0, scope=0,
                  op_schema="", inputs=empty, outputs=empty)


def test_a_parent_above_its_child_in_ids_is_no_cycle_and_a_cycle_is_still_broken() -> None:
    root = _op(1, 0, "[pytorch|profiler|execution_trace|thread]")
    # a parent with a larger id than its child (the whole-list test fails) but no cycle: the walk finds none
    rep = repair([root, _op(3, 1), _op(2, 3)], Ids(100))
    assert rep.cycles == 0 and rep.parent_of[2] == 3
    rep = repair([root, _op(2, 3), _op(3, 2)], Ids(100))
    assert rep.cycles == 1
