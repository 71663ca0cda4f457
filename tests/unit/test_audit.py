"""etweave.audit.collectives_without_dependents: which collectives gate nothing on another thread or stream, and why."""

from __future__ import annotations

from etweave.audit import WHY_NO_DEPENDENT, collectives_without_dependents
from etweave.chakra import et_def_pb2 as pb
from etweave.deps import Dependencies
from etweave.deps.evidence import Evidence
from etweave.model import HOST_OP, KERNEL, SELF_PART, Comm, Edge, Item, RecordTail
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



def _named(*tails: RecordTail) -> tuple[str, int | None, int | None]:
    """A gloo all_reduce (tid 2) issued by thread 1, nothing waiting for it, with these record tails found by the
    waits stage: its why, resumed node and micros before its end."""
    issuer = Item(1, HOST_OP, "c10d::allreduce_", start=-100, dur=100, tid=1)
    worker = Item(2, HOST_OP, "gloo:all_reduce", start=0, dur=10_000, tid=2, parent=1, comm=_comm("allreduce"))
    idle = Item(3, SELF_PART, "ProfilerStep#1 [self]", start=200, dur=8_000, seg_end=8_200, tid=1, part_of=1)
    g = graph(issuer, worker, idle, threads={1: [1, 3], 2: [2]})
    g.record_tails = list(tails)
    (found,) = collectives_without_dependents(g, _deps(Edge(1, 3, Evidence.THREAD_ORDER)))
    assert found.node == 2
    return found.why, found.resumed, found.before_end_micros


def test_a_record_tail_the_waits_stage_did_not_model_is_named() -> None:
    # docs/FACTS.md §W3: gloo wakes the waiter, then ends the record
    assert _named(RecordTail(2, 3, 1_800.4, False)) == ("issuer_resumed_before_its_end", 3, 1_800)
    assert _named() == ("not_waited_for", None, None)
    assert _named(RecordTail(2, 3, 1_800.4, True)) == ("not_waited_for", None, None)  # modelled: a wait edge
    assert "issuer_resumed_before_its_end" in WHY_NO_DEPENDENT
