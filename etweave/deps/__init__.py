"""Stage 5, infer dependencies. Each evidence source is a function `(Graph) -> list[Edge]` in SOURCES; the stage
applies them in turn, then keeps each (src, dst) pair once, first source wins, and drops edges that would go
backwards in measured time (counted). Adding a source is adding one function to SOURCES."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from etweave.deps.sources import (
    autograd,
    collective_order,
    event_wait,
    handoff,
    launch,
    stream_order,
    stream_wait,
    sync,
    tensor_flow,
    thread_order,
    thread_wait,
)
from etweave.model import PROCESS_ROOT, THREAD_ROOT, Edge, Graph, Item
from etweave.waits import TOLERANCE as WAIT_TOLERANCE

Source = Callable[[Graph], list[Edge]]

SOURCES: list[Source] = [thread_order, launch, stream_order, sync, event_wait, stream_wait, thread_wait, handoff,
                         autograd, tensor_flow, collective_order]


@dataclass(slots=True)
class Dependencies:
    preds: dict[int, list[Edge]]  # target id -> its incoming edges, in source order
    per_source: Counter[str] = field(default_factory=Counter)
    inferred: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)  # evidence that contradicts the timeline
    late: Counter[str] = field(default_factory=Counter)  # wait edges whose source ended after its target began


def infer(g: Graph, sources: list[Source] | None = None) -> Dependencies:
    for chain in (*g.threads.values(), *g.streams.values()):
        for pos, i in enumerate(chain):
            g.by_id[i].pos = pos
    deps = Dependencies(preds={})
    seen: set[tuple[int, int]] = set()
    for source in sources or SOURCES:
        for e in source(g):
            if e.src == e.dst or (e.src, e.dst) in seen:
                continue
            if not _forward(g, e):
                deps.rejected[e.source] += 1
                continue
            seen.add((e.src, e.dst))
            if e.source in WAIT_SOURCES and _ends_late(g, e):
                deps.late[e.source] += 1
            deps.preds.setdefault(e.dst, []).append(e)
            deps.per_source[e.source] += 1
            if e.inferred:
                deps.inferred[e.source] += 1
    return deps


# Sources whose edges say "the target waited for the source to end": those ended before the target started.
WAIT_SOURCES = frozenset({"stream_order", "sync", "event_wait", "stream_wait", "thread_wait"})


def _ends_late(g: Graph, e: Edge) -> bool:
    a, b = g.by_id[e.src], g.by_id[e.dst]
    return a.start + a.dur > b.start + WAIT_TOLERANCE


def _forward(g: Graph, e: Edge) -> bool:
    """An edge's source must start no later than its target (the order keys make the union acyclic)."""
    a, b = g.by_id[e.src], g.by_id[e.dst]
    return order_key(a) < order_key(b)


def order_key(it: Item) -> tuple[float, int, int, int]:
    # A strict total order on items: start time, roots before the ops they hold, place in the item's own chain
    # (equal µs-rounded starts keep program order), then id. Edges only go forward in it: the union is acyclic.
    return (it.start, 0 if it.kind in (PROCESS_ROOT, THREAD_ROOT) else 1, it.pos, it.id)
