"""The edges of the waits the waits stage (etweave.waits) found and recorded on the waiting items (`Item.awaits`):
what each wait source (`sync`, `event_wait`, `stream_wait`, `thread_wait`, `handoff`) gives."""

from __future__ import annotations

from collections.abc import Iterator

from etweave.deps.evidence import Evidence
from etweave.model import Edge, Graph, Item


def awaited(g: Graph, evidence: Evidence) -> list[Edge]:
    """The recorded waits of one evidence as edges from what was awaited to the waiting item, in item order (and
    each item's order of finding)."""
    return [Edge(a.item, it.id, evidence, a.inferred) for it in waiting(g) for a in it.awaits
            if a.evidence is evidence]


def waiting(g: Graph) -> Iterator[Item]:
    """The items that recorded a wait, in item order (those the waits stage kept, else picked: most items wait for
    nothing)."""
    if g.waiting is not None:
        return iter(g.waiting)
    # (`()` until a wait is recorded; a comprehension: an attrgetter in C costs twice its step per item)
    return iter([it for it in g.items if it.awaits])
