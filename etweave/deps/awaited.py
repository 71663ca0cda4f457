"""The wait sources: each `(Graph) -> list[Edge]`, the waits of one `Evidence` that the waits stage (etweave.waits)
found and recorded on the waiting items (`Item.awaits`), as edges from what was awaited to the waiting item."""

from __future__ import annotations

from etweave.deps.evidence import Evidence
from etweave.model import Edge, Graph


def awaited(g: Graph, evidence: Evidence) -> list[Edge]:
    """The recorded waits of one evidence, in item order (and each item's order of finding)."""
    return [Edge(a.item, it.id, evidence, a.inferred) for it in g.items for a in it.awaits if a.evidence is evidence]


def sync(g: Graph) -> list[Edge]:
    """A blocking CUDA call (stream/device/event sync, synchronous copy) resumed after the GPU op it waited for."""
    return awaited(g, Evidence.SYNC)


def event_wait(g: Graph) -> list[Edge]:
    """cudaStreamWaitEvent: the first op on the waiting stream after the op the event was recorded after (recorded
    by a `Stream Wait Event` record; inferred from the launch order where there is none)."""
    return awaited(g, Evidence.EVENT_WAIT)


def stream_wait(g: Graph) -> list[Edge]:
    """A GPU op that started later than its stream and launch allowed, after another stream's op (inferred)."""
    return awaited(g, Evidence.STREAM_WAIT)


def thread_wait(g: Graph) -> list[Edge]:
    """A thread's wake-up after the op of another thread it waited for: a collective its gloo worker ran, the
    backward pass on the autograd engine thread, a helper thread it joined (inferred)."""
    return awaited(g, Evidence.THREAD_WAIT)


def handoff(g: Graph) -> list[Edge]:
    """A worker thread's first op (or wake-up) after the op of the thread that handed it work (inferred)."""
    return awaited(g, Evidence.HANDOFF)
