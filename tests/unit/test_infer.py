"""The dependency stage on hand-built graphs: sources applied in turn, each (src, dst) kept once (first source wins),
edges backwards in measured time rejected and counted, wait edges that end late counted."""

from __future__ import annotations

from etweave.deps import SOURCES, Source, by_name, infer, order_key
from etweave.deps.evidence import Evidence
from etweave.model import HOST_OP, KERNEL, THREAD_ROOT, Edge, Graph, Item

from .graphs import graph


def _fixed(*edges: Edge) -> Source:
    """A source that gives these edges."""
    return lambda g: list(edges)


def _three() -> Graph:
    return graph(Item(1, HOST_OP, "a", start=0.0, dur=10.0, tid=1), Item(2, HOST_OP, "b", start=10.0, dur=5.0, tid=1),
                 Item(3, KERNEL, "k", start=12.0, dur=20.0), threads={1: [1, 2]}, streams={(0, 7): [3]})


def test_first_source_of_a_pair_wins_and_self_edges_are_dropped() -> None:
    g = _three()
    deps = infer(g, [_fixed(Edge(1, 2, Evidence.THREAD_ORDER), Edge(2, 2, Evidence.THREAD_ORDER)),
                     _fixed(Edge(1, 2, Evidence.TENSOR_FLOW), Edge(1, 3, Evidence.LAUNCH))])
    assert deps.preds == {2: (Edge(1, 2, Evidence.THREAD_ORDER),), 3: (Edge(1, 3, Evidence.LAUNCH),)}
    assert by_name(deps.per_source) == {"launch": 1, "thread_order": 1}


def test_a_targets_edges_are_kept_in_source_order() -> None:
    g = _three()
    deps = infer(g, [_fixed(Edge(2, 3, Evidence.SYNC)),
                     _fixed(Edge(1, 3, Evidence.TENSOR_FLOW), Edge(2, 3, Evidence.HANDOFF)),
                     _fixed(Edge(1, 3, Evidence.LAUNCH))])
    assert deps.preds == {3: (Edge(2, 3, Evidence.SYNC), Edge(1, 3, Evidence.TENSOR_FLOW))}


def test_edges_backwards_in_time_are_rejected_and_counted_per_source() -> None:
    g = _three()
    deps = infer(g, [_fixed(Edge(2, 1, Evidence.AUTOGRAD), Edge(3, 2, Evidence.STREAM_WAIT, True),
                            Edge(1, 3, Evidence.STREAM_WAIT, True))])
    assert list(deps.preds) == [3]
    assert by_name(deps.rejected) == {"autograd": 1, "stream_wait": 1}
    assert by_name(deps.inferred) == {"stream_wait": 1}


def test_equal_starts_keep_chain_order() -> None:
    a, b = Item(1, HOST_OP, "a", start=5.0, tid=1), Item(2, HOST_OP, "b", start=5.0, tid=1)
    root = Item(3, THREAD_ROOT, "t", start=5.0, tid=1)
    g = graph(b, a, root, threads={1: [3, 2, 1]})  # program order: root, b, a
    deps = infer(g, [_fixed(Edge(2, 1, Evidence.THREAD_ORDER), Edge(1, 2, Evidence.THREAD_ORDER),
                            Edge(3, 2, Evidence.THREAD_ORDER))])
    assert (b.pos, a.pos) == (1, 2)
    assert deps.preds == {1: (Edge(2, 1, Evidence.THREAD_ORDER),), 2: (Edge(3, 2, Evidence.THREAD_ORDER),)}
    assert order_key(root) < order_key(b) < order_key(a)


def test_wait_edges_from_a_source_that_ended_after_the_target_began_are_counted_late() -> None:
    g = _three()  # a ends at 10, k begins at 12; b begins at 10 and ends at 15
    deps = infer(g, [_fixed(Edge(1, 3, Evidence.SYNC), Edge(2, 3, Evidence.SYNC), Edge(2, 3, Evidence.HANDOFF)),
                     _fixed(Edge(1, 2, Evidence.AUTOGRAD))])
    assert by_name(deps.late) == {}, "b ended 3 µs after k began: within the tolerance"
    g.by_id[2].dur = 50.0
    deps = infer(g, [_fixed(Edge(2, 3, Evidence.SYNC)), _fixed(Edge(1, 3, Evidence.TENSOR_FLOW))])
    assert by_name(deps.late) == {"sync": 1}
    g.by_id[1].dur = 50.0
    deps = infer(g, [_fixed(Edge(1, 3, Evidence.TENSOR_FLOW))])
    assert by_name(deps.late) == {}, "only wait sources say the target began after the source ended"


def test_default_sources_are_the_registry_in_order() -> None:
    g = graph(Item(1, THREAD_ROOT, "t", tid=1), Item(2, HOST_OP, "a", start=1.0, tid=1), threads={1: [1, 2]})
    deps = infer(g)
    assert deps.preds == {2: (Edge(1, 2, Evidence.THREAD_ORDER),)}
    assert next(iter(SOURCES)) is Evidence.THREAD_ORDER
