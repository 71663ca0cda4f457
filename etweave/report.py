"""The audit report: every input op in the output or named, with its reason (see docs/OUTPUT.md).

`build_report` reads the finished `Conversion` and returns a typed `Report`; `Report.to_json()` is the JSON that
`etweave convert --report` writes and `Result.report` holds (`summary` and `reconciles` read that JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from etweave.collectives import CollectiveStats
from etweave.conversion import Conversion, need
from etweave.deps import Dependencies, by_name
from etweave.deps.evidence import Evidence
from etweave.fidelity import PathNode, delay_share
from etweave.link import DeviceSelection, HostLink, LeftOut
from etweave.model import DELAY, GPU_KINDS, HOST_OP, RUNTIME, THREAD_ROOT, UNTRACED, WAKEUP, Graph
from etweave.nodes import duration
from etweave.read.host_et import PG_INIT_NAME
from etweave.read.kineto import KinetoTrace
from etweave.repair import Repair
from etweave.roofline import Roofline
from etweave.serialized import serialized
from etweave.waits import NoWaitEvidence

LONG_DELAY = 100.0  # µs: delays on the critical path at least this long are listed with their evidence


@dataclass(slots=True)
class Count:
    """How many of one kind were in the input and are in the output (the rest is left out, with a reason)."""

    input: int
    output: int

    def to_json(self) -> dict[str, int]:
        return {"input": self.input, "output": self.output}


@dataclass(slots=True)
class LeftOutGroup:
    kind: str  # which count it belongs to: host_ops, cpu_ops, device_ops, runtime_calls, collectives
    reason: str
    count: int
    examples: list[str]  # the first few

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "count": self.count, "examples": self.examples}


@dataclass(slots=True)
class LinkSummary:
    method: str  # rf_id, alignment, kineto or none
    seq_offset: int
    threads: dict[str, int | str]  # host ET tid -> Kineto thread
    window_us: list[float] | None
    note: str | None = None  # the host ET is of another iteration than the Kineto trace
    mismatch: list[str] = field(default_factory=list)  # converted with --allow-mismatch: the evidence

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "seq_offset": self.seq_offset, "threads": self.threads,
                               "window_us": self.window_us}
        if self.note is not None:
            out["note"] = self.note
        if self.mismatch:
            out["mismatch"] = self.mismatch
        return out


@dataclass(slots=True)
class Synthesized:
    """Nodes that stand for no input op of their own."""

    thread_roots: int
    process_root: int = 0  # Kineto only: the process root is synthesized too
    host_ops_from_kineto: int = 0  # Kineto cpu ops in the linked window that no host op stands for

    def to_json(self) -> dict[str, int]:
        out = {"process_root": self.process_root} if self.process_root else {}
        out["thread_roots"] = self.thread_roots
        if self.host_ops_from_kineto:
            out["host_ops_from_kineto"] = self.host_ops_from_kineto
        return out


@dataclass(slots=True)
class MissingParentEntry:
    id: int
    thread: int
    orphans: int
    nodes_below: int
    collectives: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "thread": self.thread, "orphans": self.orphans, "nodes_below": self.nodes_below,
                "collectives": self.collectives}


@dataclass(slots=True)
class Orphans:
    count: int
    missing_parents: list[MissingParentEntry]

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "missing_parents": [m.to_json() for m in self.missing_parents]}


@dataclass(slots=True)
class EdgeCounts:
    total: int
    per_source: dict[str, int]
    inferred: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "per_source": self.per_source, "inferred": self.inferred}


@dataclass(slots=True)
class RooflineSummary:
    """COMP nodes with real num_ops/tensor_size (from their launching op's shapes) and with zeros."""

    comp_nodes: int
    real_values: int
    zero_values: int
    gpu_time_covered_pct: float | None
    ops_per_family: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"comp_nodes": self.comp_nodes, "real_values": self.real_values, "zero_values": self.zero_values,
                "gpu_time_covered_pct": self.gpu_time_covered_pct, "ops_per_family": self.ops_per_family}


@dataclass(slots=True)
class LongDelay:
    """A delay on the critical path of LONG_DELAY µs or more, with the evidence that nothing was awaited."""

    node: int
    name: str
    kind: str
    stream: int | None  # a GPU idle delay: its stream; else tid
    tid: str | None
    start_micros: int
    micros: int
    evidence: str

    def to_json(self) -> dict[str, Any]:
        where: dict[str, Any] = {"stream": self.stream} if self.stream is not None else {"tid": self.tid}
        return {"node": self.node, "name": self.name, "kind": self.kind, **where, "start_micros": self.start_micros,
                "micros": self.micros, "evidence": self.evidence}


@dataclass(slots=True)
class Distribution:
    """Count, total, median, 90th percentile and maximum of a list of µs."""

    count: int = 0
    total: int = 0
    p50: int = 0
    p90: int = 0
    max: int = 0

    @classmethod
    def of(cls, values: list[int]) -> Distribution:
        """Of sorted values."""
        if not values:
            return cls()

        def pick(q: float) -> int:
            return values[min(len(values) - 1, int(q * len(values)))]

        return cls(len(values), sum(values), pick(0.5), pick(0.9), values[-1])

    def to_json(self) -> dict[str, int]:
        if not self.count:
            return {"count": 0}
        return {"count": self.count, "total": self.total, "p50": self.p50, "p90": self.p90, "max": self.max}


@dataclass(slots=True)
class Delays:
    critical_path_micros: int
    share_percent: float
    by_kind_micros: dict[str, int]
    rank_start_offset_micros: int
    long_delays_on_critical_path: list[LongDelay]
    wakeup_micros: Distribution

    def to_json(self) -> dict[str, Any]:
        return {"critical_path_micros": self.critical_path_micros, "share_percent": self.share_percent,
                "by_kind_micros": self.by_kind_micros, "rank_start_offset_micros": self.rank_start_offset_micros,
                "long_delays_on_critical_path": [d.to_json() for d in self.long_delays_on_critical_path],
                "wakeup_micros": self.wakeup_micros.to_json()}


@dataclass(slots=True)
class CollectiveWithoutDependents:
    node: int
    name: str
    collective: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "name": self.name, "collective": self.collective}


@dataclass(slots=True)
class Report:
    """The audit of one rank's conversion (docs/OUTPUT.md "The audit report")."""

    rank: int
    link: LinkSummary
    host_ops: Count
    device_ops: Count
    runtime_calls: Count
    collectives: Count
    collective_type_mapping: dict[str, int]  # "FROM->TO" -> collectives whose type was mapped for the simulator
    synthesized: Synthesized
    left_out: list[LeftOutGroup]
    warnings: dict[str, int]
    orphans: Orphans
    edges: EdgeCounts
    nodes: int
    roofline: RooflineSummary
    delays: Delays
    collectives_without_dependents: list[CollectiveWithoutDependents]
    astra_sim_serialized: dict[str, dict[str, int]]  # concurrent work ASTRA-sim's one slot per class runs in turn
    cpu_ops: Count | None = None  # with a Kineto trace: its cpu ops

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank, "link": self.link.to_json(), "host_ops": self.host_ops.to_json(),
            "device_ops": self.device_ops.to_json(), "runtime_calls": self.runtime_calls.to_json(),
            "collectives": self.collectives.to_json(), "collective_type_mapping": self.collective_type_mapping,
            "synthesized": self.synthesized.to_json(), "left_out": [lo.to_json() for lo in self.left_out],
            "warnings": self.warnings, "orphans": self.orphans.to_json(), "edges": self.edges.to_json(),
            "nodes": self.nodes, "roofline": self.roofline.to_json(), "delays": self.delays.to_json(),
            "collectives_without_dependents": [c.to_json() for c in self.collectives_without_dependents],
            "astra_sim_serialized": self.astra_sim_serialized,
        }
        if self.cpu_ops is not None:
            out["cpu_ops"] = self.cpu_ops.to_json()
        return out


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
    return Report(
        rank=g.rank,
        link=_link_summary(link, c.mismatch),
        host_ops=_host_ops(c, g),
        device_ops=Count(device.gpu_input if device else 0, sum(1 for it in g.items if it.kind in GPU_KINDS)),
        runtime_calls=Count(device.runtime_input if device else 0, sum(1 for it in g.items if it.kind == RUNTIME)),
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
        delays=delays(g, deps),
        collectives_without_dependents=collectives_without_dependents(g, deps),
        astra_sim_serialized=serialized(g),
        cpu_ops=cpu_ops,
    )


def _host_ops(c: Conversion, g: Graph) -> Count:
    """Host ET ops: ops made from Kineto cpu ops are counted as cpu_ops, and Kineto only there are none."""
    if c.host is None or c.kineto_only:
        return Count(0, 0)
    from_kineto = {op.id for op in c.added_ops}
    return Count(len(c.host.ops), sum(1 for it in g.items if it.host is not None and it.id not in from_kineto))


def _synthesized(c: Conversion, g: Graph) -> Synthesized:
    if c.kineto_only:
        return Synthesized(thread_roots=sum(1 for it in g.items if it.kind == THREAD_ROOT), process_root=1)
    return Synthesized(thread_roots=sum(1 for it in g.items if it.kind == THREAD_ROOT and it.host is None),
                       host_ops_from_kineto=len(c.added_ops) if c.kineto is not None else 0)


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
        unlinked = sum(1 for it in g.items if it.kind == HOST_OP and not it.measured and it.name != PG_INIT_NAME)
        warnings["host_ops_unlinked"] = unlinked
    if rep.cycles:
        warnings["host_parent_cycles_broken"] = rep.cycles
    for source, n in sorted(stats.type_fallbacks.items()):
        warnings[f"collective_type_from_{source}"] = n
    warnings["collective_size_unknown"] = stats.size_unknown
    if stats.coalesced_without_metadata:
        warnings["collective_coalesced_without_metadata"] = stats.coalesced_without_metadata
    warnings["gpu_ops_without_launcher"] = sum(1 for it in g.items if it.kind in GPU_KINDS and it.launcher is None) \
        if c.kineto is not None else 0
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
    comp = sum(1 for it in g.items if it.comm is None)
    real = sum(1 for _ops, size in rf.values.values() if size > 0) if rf is not None else 0
    gpu, covered = (rf.gpu_time_us, rf.gpu_time_covered_us) if rf is not None else (0.0, 0.0)
    return RooflineSummary(comp, real, comp - real, round(100.0 * covered / gpu, 2) if gpu > 0 else None,
                           rf.ops if rf is not None else {})


def delays(g: Graph, deps: Dependencies) -> Delays:
    """The delay share of the critical path (fidelity.delay_share), every delay on it of LONG_DELAY µs or more with
    the evidence that nothing was awaited, and the distribution of wake-up latencies."""
    preds = deps.preds
    nodes = [PathNode(it.id, it.name, it.kind, float(duration(it)),
                      tuple(e.src for e in preds[it.id]) if it.id in preds else ()) for it in g.items]
    ds = delay_share(nodes)
    long = []
    evidence: NoWaitEvidence | None = None
    for i in ds.on_path:
        it = g.by_id[i]
        d = duration(it)
        if it.kind in (DELAY, UNTRACED) and d >= LONG_DELAY:
            evidence = evidence or NoWaitEvidence(g)
            long.append(LongDelay(i, it.name, it.kind, it.stream, str(it.tid) if it.stream is None else None,
                                  round(it.start), d, evidence.of(it)))
    wakeups = sorted(duration(it) for it in g.items if it.kind == WAKEUP)
    return Delays(
        critical_path_micros=round(ds.critical_path),
        share_percent=round(ds.share, 2),
        by_kind_micros={k: round(v) for k, v in ds.by_kind.items()},
        rank_start_offset_micros=round(ds.rank_start_offset),
        long_delays_on_critical_path=long,
        wakeup_micros=Distribution.of(wakeups),
    )


def collectives_without_dependents(g: Graph, deps: Dependencies) -> list[CollectiveWithoutDependents]:
    """Collectives whose completion gates nothing on another thread or stream (program and collective order aside):
    no thread resumed after one and no other thread or stream consumed its output. A collective's own later
    periods (`part_of`) stand for it."""
    gates: set[int] = set()
    for target, edges in deps.preds.items():
        dst = g.by_id[target]
        for e in edges:
            if e.source in (Evidence.THREAD_ORDER, Evidence.COLLECTIVE_ORDER):
                continue
            src = g.by_id[e.src]
            if (src.tid, src.device, src.stream) != (dst.tid, dst.device, dst.stream):
                gates.add(src.part_of if src.part_of is not None and src.comm is None else src.id)
    return [CollectiveWithoutDependents(it.id, it.name, it.comm.collective_name)
            for it in g.items if it.comm is not None and it.id not in gates]


def _kineto_cpu_ops(kineto: KinetoTrace, link: HostLink) -> tuple[int, LeftOut]:
    """The trace's cpu ops, and those outside the window (by the rule that selected them, so an op in the window
    that did not become a node breaks the reconciliation)."""
    converted = set(link.event_of.values())
    events = kineto.events
    lo, hi = link.window if link.window is not None else (float("-inf"), float("inf"))
    left = LeftOut()
    for i in events.cpu:
        if i not in converted and not lo <= events.ts[i] <= hi:
            left.add_at(events, i)
    return len(events.cpu), left


def reconciles(report: dict[str, Any]) -> list[str]:
    """The kinds whose input != output + left out (empty when the report accounts for everything)."""
    bad = []
    kinds = ["host_ops", "device_ops", "runtime_calls", "collectives"]
    if "cpu_ops" in report:  # every Kineto cpu op: linked, made an op, or outside the window
        kinds.append("cpu_ops")
    for kind in kinds:
        left = sum(lo["count"] for lo in report["left_out"] if lo["kind"] == kind)
        if report[kind]["input"] != report[kind]["output"] + left:
            bad.append(kind)
    return bad


def summary(report: dict[str, Any]) -> str:
    """A short human summary for the terminal."""
    def line(kind: str) -> str:
        r = report[kind]
        left = sum(lo["count"] for lo in report["left_out"] if lo["kind"] == kind)
        return f"  {kind:<13} {r['input']:>8} in  {r['output']:>8} out  {left:>8} left out"
    out = [f"rank {report['rank']}: {report['nodes']} nodes, {report['edges']['total']} edges "
           f"(linked by {report['link']['method']})"]
    out += [line(k) for k in ("host_ops", "cpu_ops", "device_ops", "runtime_calls", "collectives") if k in report]
    for lo in report["left_out"]:
        out.append(f"  left out: {lo['count']} {lo['kind']} ({lo['reason']})")
    orphans = report["orphans"]
    if orphans["count"]:
        out.append(f"  orphans: {orphans['count']} kept under their thread roots, below "
                   f"{len(orphans['missing_parents'])} missing parent(s)")
    rf = report.get("roofline")
    if rf and rf["comp_nodes"]:
        covered = f" ({rf['gpu_time_covered_pct']}% of GPU time)" if rf["gpu_time_covered_pct"] is not None else ""
        out.append(f"  roofline: {rf['real_values']} of {rf['comp_nodes']} COMP nodes with num_ops/tensor_size from "
                   f"their op's shapes{covered}, {rf['zero_values']} with zeros")
    ser = {c: v for c, v in report.get("astra_sim_serialized", {}).items() if v["nodes"]}
    if ser:
        out.append("  ran at once, serialized by ASTRA-sim's one slot per class: " +
                   ", ".join(f"{c} {v['nodes']} nodes, {v['overlap_micros']} us" for c, v in ser.items()))
    nonzero = {k: v for k, v in report["warnings"].items() if v}
    out.append("  warnings: " + (", ".join(f"{k}={v}" for k, v in nonzero.items()) if nonzero else "none"))
    if report["collective_type_mapping"]:
        out.append("  collective types mapped for the simulator: " +
                   ", ".join(f"{k} x{v}" for k, v in report["collective_type_mapping"].items()))
    if "note" in report["link"]:
        out.append(f"  note: {report['link']['note']}")
    return "\n".join(out)
