"""The repair stage on hand-built host ops: every op gets a place in a tree."""

from __future__ import annotations

from etweave.model import Ids
from etweave.read.host_et import IO, PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, HostOp
from etweave.repair import MissingParent, is_collective_call, repair


def op(op_id: int, name: str, parent: int, tid: int = 1) -> HostOp:
    return HostOp(id=op_id, name=name, parent=parent, et_tid=tid, rf_id=0, seq_id=-1, fw_parent=0, fw_tid=0,
                  scope=0, op_schema="", inputs=IO([], [], []), outputs=IO([], [], []))


PROCESS = op(1, PROCESS_ROOT_NAMES[0], 0, tid=0)
THREAD = op(2, THREAD_ROOT_NAMES[0], 1)


def test_recorded_parents_are_kept() -> None:
    rep = repair([PROCESS, THREAD, op(3, "a", 2), op(4, "b", 3)], Ids(5))
    assert rep.parent_of == {1: None, 2: 1, 3: 2, 4: 3}
    assert rep.thread_root_of == {1: 2}
    assert (rep.missing, rep.orphan_parent, rep.synthesized_roots, rep.cycles) == ([], {}, {}, 0)


def test_orphans_go_under_their_thread_root_and_the_missing_parent_is_described() -> None:
    ops = [PROCESS, THREAD, op(3, "c10d::allreduce_", 99), op(4, "aten::add", 3), op(5, "c10d::wait", 4)]
    rep = repair(ops, Ids(6))
    assert rep.parent_of[3] == 2 and rep.parent_of[4] == 3
    assert rep.orphan_parent == {3: 99}
    assert rep.missing == [MissingParent(id=99, thread=1, orphans=[3], nodes_below=3,
                                         collectives=["c10d::allreduce_"])]


def test_an_orphan_on_a_thread_without_root_gets_a_synthesized_root_from_the_allocator() -> None:
    ids = Ids(10)
    rep = repair([PROCESS, THREAD, op(3, "a", 50, tid=2), op(4, "b", 51, tid=2)], ids)
    assert rep.synthesized_roots == {2: 10}
    assert rep.parent_of[3] == rep.parent_of[4] == 10  # one root per thread
    assert rep.thread_root_of == {1: 2, 2: 10}
    assert ids.next() == 11


def test_a_thread_root_whose_parent_is_missing_hangs_below_the_process_root() -> None:
    rep = repair([PROCESS, op(2, THREAD_ROOT_NAMES[0], 77)], Ids(3))
    assert rep.parent_of[2] == 1 and rep.missing == []


def test_parent_cycles_are_broken_at_their_smallest_id() -> None:
    rep = repair([PROCESS, THREAD, op(3, "a", 4), op(4, "b", 3), op(5, "self", 5)], Ids(6))
    assert rep.cycles == 2
    assert rep.parent_of[3] == 2  # cut: under its thread's root
    assert rep.parent_of[4] == 3
    assert rep.parent_of[5] == 2


def test_a_parent_with_a_higher_id_is_kept_when_it_makes_no_cycle() -> None:
    # every parent in the file, one above its child's id: the ids prove no order, the walk up finds no cycle
    rep = repair([PROCESS, THREAD, op(3, "a", 5), op(4, "b", 2), op(5, "c", 4)], Ids(6))
    assert rep.parent_of == {1: None, 2: 1, 3: 5, 4: 2, 5: 4} and rep.cycles == 0


def test_collective_calls_are_c10d_calls_but_not_waits() -> None:
    assert is_collective_call(op(1, "c10d::allreduce_", 0))
    assert not is_collective_call(op(1, "c10d::wait", 0))
    assert not is_collective_call(op(1, "aten::add", 0))
