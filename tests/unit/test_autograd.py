"""The autograd evidence source on hand-built graphs: a backward op follows the forward op of its sequence number on
the thread the host ET names (`fw_tid`), since every thread counts sequence numbers from 0."""

from __future__ import annotations

from etweave.deps import sources
from etweave.deps.evidence import Evidence
from etweave.deps.handoff import HandOverEvidence
from etweave.model import DELAY, HOST_OP, Edge, Item
from tests.unit.graphs import graph, host_op

MAIN, HELPER, ENGINE = 1, 2, 3  # host ET thread ids; the items' tid (the Kineto thread) is 10 x that


def op(i: int, name: str, start: float, dur: float, et_tid: int, seq: int, fw_tid: int = 0,
       enclosing: int | None = None) -> Item:
    return Item(i, HOST_OP, name, start=start, dur=dur, tid=10 * et_tid, enclosing=enclosing,
                host=host_op(i, name, seq_id=seq, et_tid=et_tid, fw_tid=fw_tid))


def test_backward_op_follows_the_forward_op_on_its_forward_thread() -> None:
    """A helper thread's op with sequence number 0 ended before the main thread's (which began later): the old
    rule took the earliest op of the number, the helper's, for the forward op. The backward op on the engine
    thread names the main thread: its edge comes from the main thread's op."""
    helper_fwd = op(1, "aten::mul", 0.0, 5.0, HELPER, seq=0)
    main_fwd = op(2, "aten::mm", 10.0, 5.0, MAIN, seq=0)
    backward = op(3, "MmBackward0", 30.0, 5.0, ENGINE, seq=0, fw_tid=MAIN)
    inner = op(4, "aten::mm", 31.0, 2.0, ENGINE, seq=0, fw_tid=MAIN, enclosing=3)
    edges = sources.autograd(graph(helper_fwd, main_fwd, backward, inner))
    assert edges == [Edge(2, 3, Evidence.AUTOGRAD)]


def test_helper_thread_op_with_a_shared_number_is_no_backward_op() -> None:
    """A helper thread's forward op (fw_tid 0) that started after the main thread's op of the same number ended is
    not tied to it (the old rule did: same number, another thread, after it ended)."""
    main_fwd = op(1, "aten::mm", 0.0, 5.0, MAIN, seq=7)
    helper_fwd = op(2, "aten::mm", 20.0, 5.0, HELPER, seq=7)
    backward = op(3, "MmBackward0", 40.0, 5.0, ENGINE, seq=7, fw_tid=MAIN)
    assert sources.autograd(graph(main_fwd, helper_fwd, backward)) == [Edge(1, 3, Evidence.AUTOGRAD)]


def test_backward_of_the_helper_threads_forward_op() -> None:
    """Both threads' ops have number 0 and both have backward ops: each pairs with its own thread's forward op."""
    main_fwd = op(1, "aten::mm", 0.0, 5.0, MAIN, seq=0)
    helper_fwd = op(2, "aten::mul", 1.0, 5.0, HELPER, seq=0)
    main_bwd = op(3, "MmBackward0", 20.0, 5.0, ENGINE, seq=0, fw_tid=MAIN)
    helper_bwd = op(4, "MulBackward0", 30.0, 5.0, ENGINE, seq=0, fw_tid=HELPER)
    edges = sources.autograd(graph(main_fwd, helper_fwd, main_bwd, helper_bwd))
    assert sorted(edges, key=lambda e: e.dst) == [Edge(1, 3, Evidence.AUTOGRAD), Edge(2, 4, Evidence.AUTOGRAD)]


def test_backward_on_its_forward_thread_or_before_it_ended_gets_no_edge() -> None:
    """CPU autograd may run backward on the forward thread itself (program order already says it); a backward op
    that began before its forward op ended is not trusted; a forward op that is missing gives no edge."""
    main_fwd = op(1, "aten::mm", 0.0, 50.0, MAIN, seq=0)
    same_thread = op(2, "MmBackward0", 60.0, 5.0, MAIN, seq=0, fw_tid=MAIN)
    early = op(3, "MmBackward0", 10.0, 5.0, ENGINE, seq=0, fw_tid=MAIN)
    orphan = op(4, "AddBackward0", 70.0, 5.0, ENGINE, seq=9, fw_tid=MAIN)
    assert sources.autograd(graph(main_fwd, same_thread, early, orphan)) == []


def _measured(*items: Item) -> list[Item]:
    for it in items:
        it.measured = True
    return list(items)


def test_hand_over_by_autograd_names_the_forward_thread() -> None:
    """The hand-over evidence (deps.handoff) reads sequence numbers by the same rule: the engine thread's backward
    op was handed over by the thread its fw_tid names, not by another thread whose forward op has that number."""
    main_fwd, helper_fwd, backward, gap = _measured(
        op(1, "aten::mm", 0.0, 5.0, MAIN, seq=0), op(2, "aten::mul", 6.0, 5.0, HELPER, seq=0),
        op(3, "MmBackward0", 30.0, 5.0, ENGINE, seq=0, fw_tid=MAIN), Item(4, DELAY, "[idle]", start=0.0, dur=30.0))
    evidence = HandOverEvidence(graph(main_fwd, helper_fwd, backward, gap))
    assert evidence.shows(10 * MAIN, gap, backward) == (True, None)
    assert evidence.shows(10 * HELPER, gap, backward) == (False, None)
    # a helper's forward op with the main thread's number: no backward op, handed over by nobody (the old rule took
    # it for the backward of the main thread's op, the first of its number)
    assert evidence.shows(10 * MAIN, gap, helper_fwd) == (False, None)
