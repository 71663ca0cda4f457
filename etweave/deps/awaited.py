"""The edges of the waits the waits stage (etweave.waits) found and recorded on the waiting items (`Item.awaits`):
what each wait source (`sync`, `event_wait`, `stream_wait`, `thread_wait`, `handoff`) gives."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator

from etweave.deps.evidence import Evidence
from etweave.model import Edge, Graph, Item


def awaited(g: Graph, evidence: Evidence) -> list[Edge]:
    """The recorded waits of one evidence as edges from what was awaited to the waiting item, in item order (and
    each item's order of finding)."""
    return [Edge(a.item, it.id, evidence, a.inferred) for it in waiting(g) for a in it.awaits
            if a.evidence is evidence]


def waiting(g: Graph) -> Iterator[Item]:
    """The items that recorded a wait, in item order (those the waits stage kept, else picked in C: most items wait
    for nothing)."""
    if g.waiting is not None:
        return iter(g.waiting)
    items = g.items
    return itertools.compress(items, map(_AWAITS, items))  # `()` until a wait is recorded


_AWAITS = operator.attrgetter("awaits")
