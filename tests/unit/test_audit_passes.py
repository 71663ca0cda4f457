"""The audit's whole-list passes (etweave.audit, etweave.serialized) agree with the plain per-item rules they
stand for: the critical path on the items against `fidelity.delay_share` of path nodes, the serialized work
against `slot_class` and `_measured_span` item by item."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from etweave import audit
from etweave.chakra import schema
from etweave.deps import Dependencies
from etweave.deps.evidence import Evidence
from etweave.fidelity import RANK_START_OFFSET, PathNode, delay_share
from etweave.model import (
    DELAY,
    HOST_OP,
    KERNEL,
    PROCESS_ROOT,
    RUNTIME,
    SELF_PART,
    THREAD_ROOT,
    UNTRACED,
    WAKEUP,
    Comm,
    Edge,
    Graph,
    Item,
)
from etweave.nodes import Rounded, duration
from etweave.read.host_et import PG_INIT_NAME
from etweave.serialized import SLOT_CLASSES, _measured_span, _serialized_of, serialized, slot_class
from tests.unit.graphs import graph

_KINDS = [HOST_OP, HOST_OP, KERNEL, KERNEL, RUNTIME, SELF_PART, DELAY, UNTRACED, WAKEUP, THREAD_ROOT, PROCESS_ROOT]
_NAMES = ["op", "op", "mm", PG_INIT_NAME, RANK_START_OFFSET]
_STARTS = [-3.0, -0.4, 0.0, 0.3, 0.5, 1.5, 2.0, 7.25, 10.0]
_COMM_TYPES = [None, None, schema.COMM_COLL_NODE, schema.COMM_SEND_NODE, schema.COMM_RECV_NODE]


@st.composite
def _graphs(draw: st.DrawFn) -> tuple[Graph, Dependencies]:
    """Items of every kind the passes tell apart (markers, comm nodes, items on a stream, starts at, below and a
    fraction above 0, empty and negative lengths), ids rising with gaps, and edges along a random topological order
    (not the ids' order), the targets' lists in a random order."""
    n = draw(st.integers(0, 14))
    ids = sorted(draw(st.sets(st.integers(1, 3 * n + 3), min_size=n, max_size=n)))
    items = []
    for i in ids:
        kind = draw(st.sampled_from(_KINDS))
        start = draw(st.sampled_from(_STARTS)) + draw(st.integers(0, 3)) * 4
        comm_type = draw(st.sampled_from(_COMM_TYPES)) if kind in (HOST_OP, KERNEL) else None
        length = draw(st.sampled_from([-1.0, 0.0, 0.4, 1.0, 3.0, 6.5]))
        items.append(Item(i, kind, draw(st.sampled_from(_NAMES)), start=start,
                          dur=draw(st.sampled_from([0.0, 2.5, 9.0])), seg_end=start + length,
                          stream=draw(st.sampled_from([None, None, 7])),
                          comm=None if comm_type is None else Comm(comm_type, "allreduce", 0, 8)))
    order = draw(st.permutations(ids))
    preds: dict[int, list[Edge]] = {}
    for a, b in itertools.combinations(order, 2):
        if draw(st.integers(0, 3)) == 0:
            preds.setdefault(b, []).append(Edge(a, b, draw(st.sampled_from(list(Evidence)))))
    keys = draw(st.permutations(list(preds)))
    return graph(*items), Dependencies(preds={k: tuple(preds[k]) for k in keys})


@settings(deadline=None, max_examples=200)  # (no timing in tests: a loaded host must not fail it)
@given(_graphs())
def test_critical_path_on_the_items_is_delay_share_of_path_nodes(case: tuple[Graph, Dependencies]) -> None:
    g, deps = case
    nodes = [PathNode(it.id, it.name, it.kind, float(duration(it)), tuple(e.src for e in deps.preds.get(it.id, ())))
             for it in g.items]
    want = delay_share(nodes)
    got, no_op = audit._delay_share(g, deps, Rounded.of(g.items))
    by_id = {n.id: n for n in nodes}
    assert got.critical_path == want.critical_path
    assert (got.share, got.rank_start_offset, got.by_kind) == (want.share, want.rank_start_offset, want.by_kind)
    assert [it.id for it in no_op] == [i for i in want.on_path if by_id[i].kind in audit.NO_OP_KINDS
                                       or by_id[i].name == RANK_START_OFFSET]


@settings(deadline=None, max_examples=200)
@given(_graphs())
def test_serialized_is_the_slot_rule_item_by_item(case: tuple[Graph, Dependencies]) -> None:
    g, _ = case
    spans: dict[str | None, tuple[list[int], list[int]]] = {c: ([], []) for c in SLOT_CLASSES}
    for it in g.items:
        cls = slot_class(it)
        s, e = _measured_span(it)
        if cls is not None and it.start > 0 and e > s:
            spans[cls][0].append(int(s))
            spans[cls][1].append(int(e - s))  # (its length)
    assert serialized(g) == {c: _serialized_of(*spans[c]) for c in SLOT_CLASSES}


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(1, 60)), max_size=6))
def test_positions_are_each_ids_place(runs: list[tuple[int, int]]) -> None:
    # runs of consecutive ids (the usual case: slices), in any order, overlapping too (the last place wins)
    ids = [i for first, length in runs for i in range(first, first + length)]
    want: dict[int, int] = {}
    for k, i in enumerate(ids):
        want[i] = k
    pos = audit._positions(ids)
    assert {i: pos[i] for i in want} == want
