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
from etweave.deps.evidence import WAIT_TOLERANCE, Basis, Evidence
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
    # the kept edges but program order's (PROGRAM_ORDER), in the order kept: collected by `infer` (most edges are a
    # thread's order: not read again to leave them out); None where not collected (`beyond_program_order`)
    beyond: list[Edge] | None = None


# The evidence of program order: a thread's, and a process group's collectives in issue order. Its edges say nothing
# about one thread or stream waiting on another.
PROGRAM_ORDER = frozenset({Evidence.THREAD_ORDER, Evidence.COLLECTIVE_ORDER})


def beyond_program_order(deps: Dependencies) -> Iterable[Edge]:
    """Every kept edge but program order's (as collected by `infer`, else picked from the targets' edges)."""
    if deps.beyond is not None:
        return deps.beyond
    edges = list(itertools.chain.from_iterable(deps.preds.values()))
    return itertools.compress(edges, map(_NOT_PROGRAM_ORDER.__contains__, map(_SOURCE, edges)))


def by_name(counts: Counter[Evidence]) -> dict[str, int]:
    """Counts per evidence as the report writes them: keyed by name, in name order."""
    return {e.value: n for e, n in sorted(counts.items())}


def infer(g: Graph, applied: Iterable[Source] | None = None) -> Dependencies:
    by_id = g.by_id
    for chain in (*g.threads.values(), *g.streams.values()):
        for pos, i in enumerate(chain):
            by_id[i].pos = pos
    kept_beyond: list[Edge] = []
    deps = Dependencies(preds={}, beyond=kept_beyond)
    preds, rejected, late, beyond = deps.preds, deps.rejected, deps.late, kept_beyond.append
    # Counted as given, less the edges not kept (few), not by a pass over every kept edge: a registered source's
    # edges are all of its evidence, and inferred only where its basis allows (tests/test_deps.py recounts them).
    given, given_inferred = Counter[Evidence](), Counter[Evidence]()
    dropped: list[Edge] = []  # given and not kept: self-edges, pairs kept already, rejected edges
    get_preds, roles, drop = preds.get, _ROLES, dropped.append
    registered = SOURCES.items() if applied is None else zip(itertools.repeat(None), applied)
    for evidence, source in registered:
        edges_given = source(g)
        _count_given(evidence, edges_given, given, given_inferred)
        for e in edges_given:
            src, dst = e.src, e.dst
            if src == dst:
                drop(e)
                continue
            edges = get_preds(dst)
            # (src, dst) kept already: the first source wins (a target has a few edges: a scan, not a set of pairs)
            if edges is not None and src in map(_SRC, edges):
                drop(e)
                continue
            # an edge's source must start no later than its target (the order keys make the union acyclic); the
            # whole key is built only on equal starts
            a, b = by_id[src], by_id[dst]
            a_start, b_start = a.start, b.start
            if not (a_start < b_start or (a_start == b_start and order_key(a) < order_key(b))):
                rejected[e.source] += 1
                drop(e)
                continue
            role = roles[e.source]
            if role & _WAITS and a_start + a.dur > b_start + WAIT_TOLERANCE:  # it ended after its target began
                late[e.source] += 1
            preds[dst] = (e,) if edges is None else (*edges, e)
            if role & _BEYOND:
                beyond(e)
    given.subtract(map(_SOURCE, dropped))
    given_inferred.subtract(map(_SOURCE, itertools.compress(dropped, map(_INFERRED, dropped))))
    deps.per_source, deps.inferred = +given, +given_inferred  # (`+`: the evidence with no edge kept left out)
    return deps


def _count_given(evidence: Evidence | None, edges: list[Edge], given: Counter[Evidence],
                 given_inferred: Counter[Evidence]) -> None:
    """Count a source's edges (`evidence`: the source's own where registered, None for a source of the caller's,
    whose edges are counted one by one)."""
    if evidence is None:
        given.update(map(_SOURCE, edges))
    else:
        given[evidence] += len(edges)
    if evidence is None or evidence.basis is not Basis.RECORDED:
        given_inferred.update(map(_SOURCE, itertools.compress(edges, map(_INFERRED, edges))))


_SRC, _SOURCE, _INFERRED = operator.attrgetter("src"), operator.attrgetter("source"), operator.attrgetter("inferred")
# Each evidence's role, read once per kept edge (a dict lookup: the property costs a call per edge): its edges are
# waits, and they are beyond program order.
_WAITS, _BEYOND = 1, 2
_ROLES = {evidence: (_WAITS if evidence.waits else 0) | (_BEYOND if evidence not in PROGRAM_ORDER else 0)
          for evidence in Evidence}
_NOT_PROGRAM_ORDER = frozenset(Evidence) - PROGRAM_ORDER


def order_key(it: Item) -> tuple[float, int, int, int]:
    # A strict total order on items: start time, roots before the ops they hold, place in the item's own chain
    # (equal µs-rounded starts keep program order), then id. Edges only go forward in it: the union is acyclic.
    return (it.start, 0 if it.kind in (PROCESS_ROOT, THREAD_ROOT) else 1, it.pos, it.id)
