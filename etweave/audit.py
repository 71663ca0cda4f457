"""Stage: audit. Reads the finished `Conversion` and fills the typed `Report` (etweave.report): what went in and
came out, what was left out and why, edges per evidence, delays on the critical path with their evidence."""

from __future__ import annotations

import itertools
import operator

from etweave.collectives import COMM_MADE_OF, CollectiveStats
from etweave.conversion import Conversion, need
from etweave.deps import Dependencies, beyond_program_order, by_name
from etweave.deps.evidence import Evidence
from etweave.fidelity import (
    NO_OP_KINDS,
    RANK_START_OFFSET,
    SEVERAL,
    DelayShare,
    PathNode,
    Successors,
    longest_path,
    share_of_path,
)
from etweave.link import DeviceSelection, HostLink, LeftOut
from etweave.model import (
    DELAY,
    GPU_KINDS,
    HOST_OP,
    PROCESS_ROOT,
    RUNTIME,
    THREAD_ROOT,
    UNTRACED,
    WAKEUP,
    Edge,
    Graph,
    Item,
)
from etweave.nodes import Rounded, duration
from etweave.read.host_et import PG_INIT_NAME
from etweave.read.kineto import KinetoTrace
from etweave.repair import Repair
from etweave.report import (
    CollectiveWithoutDependents,
    Count,
    Delays,
    Distribution,
    EdgeCounts,
    LeftOutGroup,
    LinkSummary,
    LongDelay,
    MissingParentEntry,
    Orphans,
    RecordTailEntry,
    Report,
    RooflineSummary,
    Synthesized,
)
from etweave.roofline import Roofline
from etweave.serialized import serialized
from etweave.waits import NoWaitEvidence

LONG_DELAY = 100.0  # µs: delays on the critical path at least this long are listed with their evidence


def build_report(c: Conversion) -> Report:
    """The audit of a conversion whose stages have all run."""
    g, deps, link = need(c.graph, "graph"), need(c.deps, "dependencies"), need(c.link, "link")
    stats, rep = need(c.collectives, "collective stats"), need(c.repair, "repair")
    left_out = _left_out(c.device, stats)
    cpu_ops = None
    if c.kineto is not None:
        cpu_in, cpu_left = _kineto_cpu_ops(c.kineto, link)
        cpu_ops = Count(cpu_in, len(link.event_of))
        if cpu_left.count:
            left_out.append(LeftOutGroup("cpu_ops", "outside_window", cpu_left.count, cpu_left.examples))
    device = c.device
    rounded = c.times or Rounded.of(g.items)  # the nodes' times: the delays and the serialized work read them
    return Report(
        rank=g.rank,
        link=_link_summary(link, c.mismatch),
        host_ops=_host_ops(c, g),
        device_ops=Count(device.gpu_input if device else 0, len(g.of_kinds(GPU_KINDS))),
        runtime_calls=Count(device.runtime_input if device else 0, len(g.of_kinds(_RUNTIME))),
        collectives=Count(stats.calls, stats.comm_nodes),
        collective_type_mapping=dict(sorted(stats.mapped.items())),
        synthesized=_synthesized(c, g),
        left_out=left_out,
        warnings=_warnings(c, g, deps, stats, rep),
        orphans=Orphans(len(rep.orphan_parent), [
            MissingParentEntry(m.id, m.thread, len(m.orphans), m.nodes_below, m.collectives) for m in rep.missing]),
        edges=EdgeCounts(sum(deps.per_source.values()), by_name(deps.per_source), by_name(deps.inferred)),
        nodes=len(g.items),
        roofline=_roofline(g, c.roofline),
        delays=delays(g, deps, rounded),
        collectives_without_dependents=collectives_without_dependents(g, deps),
        astra_sim_serialized=serialized(g, rounded),
        record_tails=[RecordTailEntry(t.op, g.by_id[t.op].name, round(t.tail)) for t in g.record_tails if t.modelled],
        cpu_ops=cpu_ops,
    )


def _host_ops(c: Conversion, g: Graph) -> Count:
    """Host ET ops: ops made from Kineto cpu ops are counted as cpu_ops, and Kineto only there are none."""
    if c.host is None:
        return Count(0, 0)
    from_kineto = {op.id for op in c.added_ops}
    return Count(len(c.host.ops), sum(1 for it in g.items if it.host is not None and it.id not in from_kineto))


def _synthesized(c: Conversion, g: Graph) -> Synthesized:
    thread_roots = g.of_kinds(_THREAD_ROOT)
    if c.kineto_only:
        return Synthesized(thread_roots=len(thread_roots), process_root=1)
    return Synthesized(thread_roots=operator.countOf(map(_HOST, thread_roots), None),
                       host_ops_from_kineto=len(c.added_ops))


def _link_summary(link: HostLink, mismatch: list[str]) -> LinkSummary:
    summary = LinkSummary(link.method, link.seq_offset, {str(k): v for k, v in sorted(link.kthread_of.items())},
                          list(link.window) if link.window else None, mismatch=mismatch)
    # With a mismatch, "the structurally identical iteration" would claim too much.
    if link.seq_offset and not mismatch:
        summary.note = (f"the host ET comes from another iteration than the Kineto trace (sequence numbers "
                        f"differ by {link.seq_offset}); linked to the structurally identical iteration")
    return summary


def _left_out(device: DeviceSelection | None, stats: CollectiveStats) -> list[LeftOutGroup]:
    left_out: list[LeftOutGroup] = []
    if device is not None:
        for (kind, reason), lo in sorted(device.left_out.items()):
            left_out.append(LeftOutGroup(kind, reason, lo.count, lo.examples))
    if stats.unmatched_calls:
        left_out.append(LeftOutGroup("collectives", "no_communication_work_recorded", len(stats.unmatched_calls),
                                     [f"{op.name} (host id {op.id})" for op in stats.unmatched_calls[:5]]))
    return left_out


def _warnings(c: Conversion, g: Graph, deps: Dependencies, stats: CollectiveStats, rep: Repair) -> dict[str, int]:
    """Every warning count, sorted by name; `inputs_mismatched` last (converted because --allow-mismatch)."""
    warnings: dict[str, int] = {}
    for src in (c.host.warnings if c.host else {}, c.kineto.warnings if c.kineto else {},
                need(c.link, "link").warnings):
        warnings.update(src)
    if c.kineto is not None and c.host is not None:
        # `## process_group:init ##` is written when the observer starts: Kineto never has it.
        unlinked = sum(1 for it in g.of_kinds(_HOST_OP) if not it.measured and it.name != PG_INIT_NAME)
        warnings["host_ops_unlinked"] = unlinked
    if rep.cycles:
        warnings["host_parent_cycles_broken"] = rep.cycles
    for source, n in sorted(stats.type_fallbacks.items()):
        warnings[f"collective_type_from_{source}"] = n
    warnings["collective_size_unknown"] = stats.size_unknown
    if stats.coalesced_without_metadata:
        warnings["collective_coalesced_without_metadata"] = stats.coalesced_without_metadata
    if c.kineto is not None:
        warnings["gpu_ops_without_launcher"] = len([it for it in g.of_kinds(GPU_KINDS) if it.launcher is None])
    else:
        warnings["gpu_ops_without_launcher"] = 0
    for source, n in sorted(deps.rejected.items()):
        warnings[f"edges_rejected_{source}"] = n
    for source, n in sorted(deps.late.items()):
        warnings[f"wait_edges_ending_late_{source}"] = n
    warnings = dict(sorted(warnings.items()))
    if c.mismatch:
        warnings["inputs_mismatched"] = 1
    return warnings


def _roofline(g: Graph, rf: Roofline | None) -> RooflineSummary:
    """COMP nodes with real num_ops/tensor_size (from their launching op's shapes) and with zeros."""
    made_of = g.of_kinds(COMM_MADE_OF)
    comp = len(g.items) - len([it for it in made_of if it.comm is not None])
    real = sum(1 for _ops, size in rf.values.values() if size > 0) if rf is not None else 0
    gpu, covered = (rf.gpu_time_us, rf.gpu_time_covered_us) if rf is not None else (0.0, 0.0)
    return RooflineSummary(comp, real, comp - real, round(100.0 * covered / gpu, 2) if gpu > 0 else None,
                           rf.ops if rf is not None else {})


def delays(g: Graph, deps: Dependencies, rounded: Rounded | None = None) -> Delays:
    """The delay share of the critical path (fidelity.delay_share), every delay on it of LONG_DELAY µs or more with
    the evidence that nothing was awaited, and the distribution of wake-up latencies. (`rounded`: the items' times,
    when made already.)"""
    ds, no_op_on_path = _delay_share(g, deps, rounded or Rounded.of(g.items))
    long = []
    evidence: NoWaitEvidence | None = None
    for it in no_op_on_path:
        if it.kind not in (DELAY, UNTRACED):
            continue
        d = duration(it)
        if d >= LONG_DELAY:
            evidence = evidence or NoWaitEvidence(g)
            long.append(LongDelay(it.id, it.name, it.kind, it.stream, str(it.tid) if it.stream is None else None,
                                  round(it.start), d, evidence.of(it)))
    # a wake-up is made with the wait it ended (etweave.waits): read from the items that wait (a few), not all
    waiting = g.waiting if g.waiting is not None else g.items
    wakeups = sorted(map(duration, itertools.compress(waiting, map(operator.eq, map(_KIND, waiting),
                                                                   itertools.repeat(WAKEUP)))))
    return Delays(
        critical_path_micros=round(ds.critical_path),
        share_percent=round(ds.share, 2),
        by_kind_micros={k: round(v) for k, v in ds.by_kind.items()},
        rank_start_offset_micros=round(ds.rank_start_offset),
        long_delays_on_critical_path=long,
        wakeup_micros=Distribution.of(wakeups),
    )


def _delay_share(g: Graph, deps: Dependencies, rounded: Rounded) -> tuple[DelayShare, list[Item]]:
    """`fidelity.delay_share` of the nodes the items become, read from the items and edges (no node per item), and
    the critical path's items that stand for no op, in path order: the only ones whose kind and duration the share
    adds up (`share_of_path`), so the only ones it is given (its `on_path` lists them alone)."""
    items = g.items
    ids = [it.id for it in items]  # (a comprehension: an attrgetter in C costs twice its step per item)
    pos = _positions(ids)
    durations = _durations(g, rounded, pos)
    cp, path = longest_path(ids, durations, _successors(ids, deps.preds, pos))
    del pos
    # the path's items that stand for no op: of NO_OP_KINDS, or the rank start offset (inline: a call per item of
    # the path cost more than the test)
    no_op = [k for k in path if (it := items[k]).kind in NO_OP_KINDS or it.name == RANK_START_OFFSET]
    share = share_of_path(cp, [PathNode(items[k].id, items[k].name, items[k].kind, float(durations[k]), ())
                               for k in no_op])
    return share, [items[k] for k in no_op]


def _successors(ids: list[int], preds: dict[int, tuple[Edge, ...]], pos: list[int] | dict[int, int]) -> Successors:
    """Each node's successors (`fidelity.Successors`), filled in one pass over the targets' edges (in the edges'
    order, not a lookup per item); a node's several successors sorted after: in item order, as `Successors.of` gives
    them for edges met in item order (a (src, dst) pair is kept once: the lists hold no ties)."""
    n = len(ids)
    first, several, indeg = [-1] * n, {}, [0] * n
    many = SEVERAL
    for i, incoming in preds.items():
        k = pos[i]  # (the int `pos` holds, not one more of each: 6 MB on a trace of 224k items)
        indeg[k] = len(incoming)
        for e in incoming:
            p = pos[e.src]
            f = first[p]
            if f == -1:
                first[p] = k
            elif f >= 0:
                several[p] = [f, k]
                first[p] = many
            else:
                several[p].append(k)
    for later in several.values():
        later.sort()
    return Successors(first, several, indeg)


def _positions(ids: list[int]) -> list[int] | dict[int, int]:
    """id -> position: a list indexed by id where the ids are dense enough, else a dict."""
    n = len(ids)
    if n and min(ids) >= 0 and max(ids) < 4 * n + 1024:
        pos = [0] * (max(ids) + 1)
        for k, i in enumerate(ids):
            pos[i] = k
        return pos
    return dict(zip(ids, range(n), strict=True))


def _durations(g: Graph, rounded: Rounded, pos: list[int] | dict[int, int]) -> list[int]:
    """`nodes.duration` of every item (by position; `pos`: id -> position) in C passes over the rounded times:
    negative lengths and the markers (roots, `## process_group:init ##`) 0. (Ints: the path's float starts add
    them exactly as their floats, and most are small ints Python shares, where a float each held 5 MB more on a
    trace of 224k items.)"""
    lengths = list(rounded.length)
    for k in itertools.compress(range(len(lengths)), map(operator.gt, itertools.repeat(0), lengths)):
        lengths[k] = 0
    host_ops = g.of_kinds(_HOST_OP)
    markers = itertools.chain(g.of_kinds(_PROCESS_ROOT), g.of_kinds(_THREAD_ROOT),
                              [it for it in host_ops if it.name == PG_INIT_NAME])
    for it in markers:
        lengths[pos[it.id]] = 0
    return lengths


_KIND = operator.attrgetter("kind")
_HOST = operator.attrgetter("host")
# (one kind a set, as the stages before index them: `Graph.of_kinds` finds each in its index)
_HOST_OP, _RUNTIME = frozenset({HOST_OP}), frozenset({RUNTIME})
_PROCESS_ROOT, _THREAD_ROOT = frozenset({PROCESS_ROOT}), frozenset({THREAD_ROOT})


def collectives_without_dependents(g: Graph, deps: Dependencies) -> list[CollectiveWithoutDependents]:
    """Collectives whose completion gates nothing on another thread or stream (program and collective order aside):
    no thread resumed after one and no other thread or stream consumed its output. A collective's own later
    periods (`part_of`) stand for it. Each says why (`WHY_NO_DEPENDENT`)."""
    gates: set[int] = set()
    next_on_stream: dict[int, int] = {}
    by_id = g.by_id
    stream_order = Evidence.STREAM_ORDER
    for e in beyond_program_order(deps):  # (in any order: a stream op has one next, the gates are a set)
        if e.source is stream_order:
            next_on_stream[e.src] = e.dst
        dst, src = by_id[e.dst], by_id[e.src]
        # another thread or stream (compared field by field: most edges, launches, differ in their first)
        if src.tid != dst.tid or src.stream != dst.stream or src.device != dst.device:
            gates.add(src.part_of if src.part_of is not None and src.comm is None else src.id)
    out = []
    memo: dict[int, int | None] = {}
    made_of = g.of_kinds(COMM_MADE_OF)  # (the only items a comm node is made of: a tenth to a third of them)
    for it in [it for it in made_of if it.comm is not None]:
        if it.id in gates:
            continue
        comm = it.comm
        assert comm is not None
        issuer = by_id.get(it.parent) if it.parent is not None else None
        if it.stream is None and issuer is not None and issuer.tid == it.tid:
            out.append(CollectiveWithoutDependents(it.id, it.name, comm.collective_name, "ran_on_issuing_thread"))
            continue
        through = _gate_later_on_stream(it.id, next_on_stream, gates, memo)
        why = "not_waited_for" if through is None else "waited_for_through_stream"
        out.append(CollectiveWithoutDependents(it.id, it.name, comm.collective_name, why, through))
    _name_unmodelled_tails(g, out)
    return out


def _name_unmodelled_tails(g: Graph, found: list[CollectiveWithoutDependents]) -> None:
    """Of the collectives `found` not waited for, those whose handing thread resumed while their record was open
    but whose wait was not modelled (`Graph.record_tails`, deps.thread_wait.find_record_tails): relabelled with the
    idle period it resumed after and how long before the record's end."""
    named = {t.op: t for t in g.record_tails if not t.modelled}
    for c in found:
        tail = named.get(c.node)
        if tail is not None and c.why == "not_waited_for":
            c.why, c.resumed, c.before_end_micros = "issuer_resumed_before_its_end", tail.period, round(tail.tail)


WHY_NO_DEPENDENT = {
    "ran_on_issuing_thread": "it ran on the thread that issued it (gloo send/recv): program order carries its end",
    "waited_for_through_stream": "work waits for a later op of its stream (`through`), and so for it by stream order",
    "not_waited_for": "nothing on another thread or stream waited for it, or for its stream after it, in the trace",
    "issuer_resumed_before_its_end": "the thread that handed it over was idle from then on and resumed (`resumed`) "
                                     "while its record was still open (`before_end_micros` before its end), having "
                                     "waited less long than the record then stayed open: maybe a wait for it, left "
                                     "in that idle node's duration",
}


def _gate_later_on_stream(start: int, next_on_stream: dict[int, int], gates: set[int],
                          memo: dict[int, int | None]) -> int | None:
    """The first op after `start` on its stream whose end another thread or stream waited for, if any (`memo`
    keeps each op's answer: a stream's collectives share one walk)."""
    path: list[int] = []
    node = next_on_stream.get(start)
    found: int | None = None
    while node is not None:
        if node in memo:
            found = memo[node]
            break
        if node in gates:
            found = node
            break
        path.append(node)
        node = next_on_stream.get(node)
    for p in path:
        memo[p] = found
    return found


def _kineto_cpu_ops(kineto: KinetoTrace, link: HostLink) -> tuple[int, LeftOut]:
    """The trace's cpu ops, and those outside the window (by the rule that selected them, so an op in the window
    that did not become a node breaks the reconciliation)."""
    converted = set(link.event_of.values())
    events = kineto.events
    lo, hi = link.window if link.window is not None else (float("-inf"), float("inf"))
    ts = events.ts
    left = LeftOut()
    left.add_all(events, [i for i in events.cpu if i not in converted and not lo <= ts[i] <= hi])
    return len(events.cpu), left
