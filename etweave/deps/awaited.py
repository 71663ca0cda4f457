"""The edges of the waits the waits stage (etweave.waits) found and recorded on the waiting items (`Item.awaits`):
what each wait source (`sync`, `event_wait`, `stream_wait`, `thread_wait`, `handoff`) gives."""

from __future__ import annotations

from etweave.deps.evidence import Evidence
from etweave.model import Edge, Graph


def awaited(g: Graph, evidence: Evidence) -> list[Edge]:
    """The recorded waits of one evidence as edges from what was awaited to the waiting item, in item order (and
    each item's order of finding)."""
    return [Edge(a.item, it.id, evidence, a.inferred) for it in g.items for a in it.awaits if a.evidence is evidence]
