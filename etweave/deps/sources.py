"""Evidence sources: each `(Graph) -> list[Edge]`, one kind of evidence each."""

from __future__ import annotations

from etweave.model import PROCESS_ROOT, THREAD_ROOT, Edge, Graph


def thread_order(g: Graph) -> list[Edge]:
    """Ops on one CPU thread run one after another in measured order; each thread root follows the process root."""
    edges: list[Edge] = []
    for order in g.threads.values():
        edges.extend(Edge(a, b, "thread_order") for a, b in zip(order, order[1:]))
    root = next((it.id for it in g.items if it.kind == PROCESS_ROOT), None)
    if root is not None:
        edges.extend(Edge(root, it.id, "thread_order") for it in g.items if it.kind == THREAD_ROOT)
    return edges


def launch(g: Graph) -> list[Edge]:
    """A runtime launch call -> the GPU event it launched (Kineto correlation)."""
    return [Edge(it.launcher, it.id, "launch") for it in g.items if it.launcher is not None]


def stream_order(g: Graph) -> list[Edge]:
    """Events on one (device, stream) run in measured order."""
    edges: list[Edge] = []
    for order in g.streams.values():
        edges.extend(Edge(a, b, "stream_order") for a, b in zip(order, order[1:]))
    return edges
