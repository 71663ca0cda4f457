"""etweave.audit.collectives_without_dependents: which collectives gate nothing on another thread or stream, and why."""

from __future__ import annotations

import pytest

from etweave.audit import WHY_NO_DEPENDENT, collectives_without_dependents
from etweave.chakra import et_def_pb2 as pb
from etweave.deps import Dependencies
from etweave.deps.evidence import MAX_WAKEUP, Evidence
from etweave.deps.thread_wait import MIN_WAIT
from etweave.model import DELAY, HOST_OP, KERNEL, SELF_PART, Comm, Edge, Item
from tests.unit.graphs import graph


def _comm(name: str) -> Comm:
    return Comm(pb.COMM_COLL_NODE, name, pb.ALL_REDUCE, 1024)


def _deps(*edges: Edge) -> Dependencies:
    preds: dict[int, list[Edge]] = {}
    for e in edges:
        preds.setdefault(e.dst, []).append(e)
    return Dependencies(preds=preds)


def test_each_collective_without_a_dependent_says_why() -> None:
    # stream (0, 9): all_reduce 1, 2, 3 in turn; a kernel of stream (0, 7) waits (event) for 2 only
    ar1 = Item(1, KERNEL, "ar1", start=0, dur=10, device=0, stream=9, comm=_comm("allreduce"))
    ar2 = Item(2, KERNEL, "ar2", start=10, dur=10, device=0, stream=9, comm=_comm("allreduce"))
    ar3 = Item(3, KERNEL, "ar3", start=20, dur=10, device=0, stream=9, comm=_comm("allreduce"))
    consumer = Item(4, KERNEL, "mm", start=25, dur=5, device=0, stream=7)
    # a gloo send run on the thread that issued it, and an all_reduce a thread resumed after
    issuer = Item(5, HOST_OP, "c10d::send", start=0, dur=20, tid=1)
    send = Item(6, HOST_OP, "gloo:send", start=2, dur=5, tid=1, parent=5, comm=_comm("send"))
    worker_ar = Item(7, HOST_OP, "gloo:all_reduce", start=0, dur=30, tid=2, comm=_comm("allreduce"))
    resumed = Item(8, HOST_OP, "aten::add", start=31, dur=1, tid=1)
    g = graph(ar1, ar2, ar3, consumer, issuer, send, worker_ar, resumed,
              threads={1: [5, 6, 8], 2: [7]}, streams={(0, 9): [1, 2, 3], (0, 7): [4]})
    deps = _deps(Edge(1, 2, Evidence.STREAM_ORDER), Edge(2, 3, Evidence.STREAM_ORDER),
                 Edge(2, 4, Evidence.EVENT_WAIT), Edge(5, 6, Evidence.THREAD_ORDER),
                 Edge(6, 8, Evidence.THREAD_ORDER), Edge(7, 8, Evidence.THREAD_WAIT))
    found = {c.node: (c.why, c.through) for c in collectives_without_dependents(g, deps)}
    assert found == {1: ("waited_for_through_stream", 2), 3: ("not_waited_for", None),
                     6: ("ran_on_issuing_thread", None)}
    assert {why for why, _ in found.values()} <= WHY_NO_DEPENDENT.keys()


def _handed_over(idle_start: float, idle_end: float, kind: str = SELF_PART, measured: bool = True,
                 record_end: float = 10_000) -> tuple[str, int | None, int | None]:
    """A gloo all_reduce (tid 2, from 0 to `record_end`) issued by thread 1, whose next period is idle from
    `idle_start` to `idle_end`, nothing waiting for the collective: its why, resumed node and micros before its end."""
    issuer = Item(1, HOST_OP, "c10d::allreduce_", start=-100, dur=100, tid=1)
    worker = Item(2, HOST_OP, "gloo:all_reduce", start=0, dur=record_end, tid=2, parent=1, comm=_comm("allreduce"),
                  measured=True)
    idle = Item(3, kind, "ProfilerStep#1 [self]", start=idle_start, dur=idle_end - idle_start, seg_end=idle_end,
                tid=1, measured=measured, part_of=1)
    g = graph(issuer, worker, idle, threads={1: [1, 3], 2: [2]})
    (found,) = collectives_without_dependents(g, _deps(Edge(1, 3, Evidence.THREAD_ORDER)))
    assert found.node == 2
    return found.why, found.resumed, found.before_end_micros


def test_an_issuer_idle_from_the_hand_over_that_resumed_before_the_record_ended_is_named() -> None:
    # docs/FACTS.md §W3: gloo wakes the waiter, then ends the record
    assert _handed_over(200, 8_200) == ("issuer_resumed_before_its_end", 3, 1_800)
    assert _handed_over(200, 8_200, kind=DELAY) == ("issuer_resumed_before_its_end", 3, 1_800)
    assert _handed_over(-5, 30) == ("issuer_resumed_before_its_end", 3, 9_970)  # a short wait, from the hand-over
    assert "issuer_resumed_before_its_end" in WHY_NO_DEPENDENT


@pytest.mark.parametrize(("idle_start", "idle_end", "kind", "measured"), [
    (MAX_WAKEUP + 1, 8_200, SELF_PART, True),  # the thread did traced work after the hand-over first
    (200, 200 + MIN_WAIT - 1, SELF_PART, True),  # too short to have waited
    (200, 10_000, SELF_PART, True),  # resumed at the record's end: a wait the finders see, not this case
    (200, 8_200, HOST_OP, True),  # an op of its own, not idle time
    (200, 8_200, SELF_PART, False),  # placed, not measured
])
def test_other_periods_of_the_issuer_leave_it_not_waited_for(idle_start: float, idle_end: float, kind: str,
                                                            measured: bool) -> None:
    assert _handed_over(idle_start, idle_end, kind, measured) == ("not_waited_for", None, None)
