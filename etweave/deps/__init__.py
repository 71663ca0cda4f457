"""Stage infer_dependencies, after the waits. Each evidence source is a function `(Graph) -> list[Edge]`, registered in
SOURCES under its `Evidence` member (the sources read from the graph's structure in `sources.py`; each wait source in
its own module with the finder that the waits stage runs: `sync`, `event_wait`, `stream_wait`, `thread_wait`,
`handoff`); the stage applies them in turn, then keeps each (src, dst) pair once, first source
wins, and drops edges that would go backwards in measured time (counted). Adding a source is adding one function,
one `Evidence` member and its place in SOURCES."""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from collections.abc import Callable, Iterable

import msgspec
from msgspec import field

from etweave.deps import event_wait, handoff, sources, stream_wait, sync, thread_wait
from etweave.deps.evidence import WAIT_TOLERANCE, Evidence
from etweave.model import PROCESS_ROOT, THREAD_ROOT, Edge, Graph, Item

Source = Callable[[Graph], list[Edge]]

# The per-rank evidence sources in the order they are applied (the first source of an edge is the one kept).
SOURCES: dict[Evidence, Source] = {
    Evidence.THREAD_ORDER: sources.thread_order,
    Evidence.LAUNCH: sources.launch,
    Evidence.STREAM_ORDER: sources.stream_order,
    Evidence.SYNC: sync.sync,
    Evidence.EVENT_WAIT: event_wait.event_wait,
    Evidence.STREAM_WAIT: stream_wait.stream_wait,
    Evidence.THREAD_WAIT: thread_wait.thread_wait,
    Evidence.HANDOFF: handoff.handoff,
    Evidence.AUTOGRAD: sources.autograd,
    Evidence.TENSOR_FLOW: sources.tensor_flow,
    Evidence.COLLECTIVE_ORDER: sources.collective_order,
}


class Dependencies(msgspec.Struct):
    # target id -> its incoming edges, in source order: a tuple (most targets have one edge, and a tuple of one
    # holds 48 bytes where a list held 80 to 128: 14 MB less on a trace of 224k items)
    preds: dict[int, tuple[Edge, ...]]
    per_source: Counter[Evidence] = field(default_factory=Counter)
    inferred: Counter[Evidence] = field(default_factory=Counter)
    rejected: Counter[Evidence] = field(default_factory=Counter)  # evidence that contradicts the timeline
    late: Counter[Evidence] = field(default_factory=Counter)  # wait edges whose source ended after its target began


def by_name(counts: Counter[Evidence]) -> dict[str, int]:
    """Counts per evidence as the report writes them: keyed by name, in name order."""
    return {e.value: n for e, n in sorted(counts.items())}


def infer(g: Graph, applied: Iterable[Source] | None = None) -> Dependencies:
    by_id = g.by_id
    for chain in (*g.threads.values(), *g.streams.values()):
        for pos, i in enumerate(chain):
            by_id[i].pos = pos
    deps = Dependencies(preds={})
    preds, rejected, late = deps.preds, deps.rejected, deps.late
    get_preds, waits = preds.get, _WAITS
    for source in SOURCES.values() if applied is None else applied:
        for e in source(g):
            src, dst = e.src, e.dst
            if src == dst:
                continue
            edges = get_preds(dst)
            # (src, dst) kept already: the first source wins (a target has a few edges: a scan, not a set of pairs)
            if edges is not None and src in map(_SRC, edges):
                continue
            # an edge's source must start no later than its target (the order keys make the union acyclic); the
            # whole key is built only on equal starts
            a, b = by_id[src], by_id[dst]
            a_start, b_start = a.start, b.start
            if not (a_start < b_start or (a_start == b_start and order_key(a) < order_key(b))):
                rejected[e.source] += 1
                continue
            if waits[e.source] and a_start + a.dur > b_start + WAIT_TOLERANCE:  # it ended after its target began
                late[e.source] += 1
            preds[dst] = (e,) if edges is None else (*edges, e)
    # counted once every edge is kept (one pass in C, not a count per edge)
    kept = list(itertools.chain.from_iterable(preds.values()))
    deps.per_source.update(map(_SOURCE, kept))
    deps.inferred.update(map(_SOURCE, itertools.compress(kept, map(_INFERRED, kept))))
    return deps


_SRC, _SOURCE, _INFERRED = operator.attrgetter("src"), operator.attrgetter("source"), operator.attrgetter("inferred")
_WAITS = {evidence: evidence.waits for evidence in Evidence}  # (a dict lookup: the property costs a call per edge)


def order_key(it: Item) -> tuple[float, int, int, int]:
    # A strict total order on items: start time, roots before the ops they hold, place in the item's own chain
    # (equal µs-rounded starts keep program order), then id. Edges only go forward in it: the union is acyclic.
    return (it.start, 0 if it.kind in (PROCESS_ROOT, THREAD_ROOT) else 1, it.pos, it.id)
