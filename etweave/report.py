"""The audit report's shape: every input op in the output or named, with its reason (see docs/OUTPUT.md).

`etweave.audit.build_report` fills a typed `Report` from a finished conversion; `Report.to_json()` is the JSON that
`etweave convert --report` writes and `Result.report` holds (`summary` and `reconciles` read that JSON)."""

from __future__ import annotations

from typing import Any

import msgspec

from etweave.stats import upper_percentile


class Count(msgspec.Struct):
    """How many of one kind were in the input and are in the output (the rest is left out, with a reason)."""

    input: int
    output: int

    def to_json(self) -> dict[str, int]:
        return {"input": self.input, "output": self.output}


class LeftOutGroup(msgspec.Struct):
    kind: str  # which count it belongs to: host_ops, cpu_ops, device_ops, runtime_calls, collectives
    reason: str
    count: int
    examples: list[str]  # the first few

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "count": self.count, "examples": self.examples}


class LinkSummary(msgspec.Struct):
    method: str  # rf_id, alignment, kineto or none
    seq_offset: int
    threads: dict[str, int | str]  # host ET tid -> Kineto thread
    window_us: list[float] | None
    note: str | None = None  # the host ET is of another iteration than the Kineto trace
    mismatch: list[str] = msgspec.field(default_factory=list)  # converted with --allow-mismatch: the evidence

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "seq_offset": self.seq_offset, "threads": self.threads,
                               "window_us": self.window_us}
        if self.note is not None:
            out["note"] = self.note
        if self.mismatch:
            out["mismatch"] = self.mismatch
        return out


class Synthesized(msgspec.Struct):
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


class MissingParentEntry(msgspec.Struct):
    id: int
    thread: int
    orphans: int
    nodes_below: int
    collectives: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "thread": self.thread, "orphans": self.orphans, "nodes_below": self.nodes_below,
                "collectives": self.collectives}


class Orphans(msgspec.Struct):
    count: int
    missing_parents: list[MissingParentEntry]

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "missing_parents": [m.to_json() for m in self.missing_parents]}


class EdgeCounts(msgspec.Struct):
    total: int
    per_source: dict[str, int]
    inferred: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "per_source": self.per_source, "inferred": self.inferred}


class RooflineSummary(msgspec.Struct):
    """COMP nodes with real num_ops/tensor_size (from their launching op's shapes) and with zeros."""

    comp_nodes: int
    real_values: int
    zero_values: int
    gpu_time_covered_pct: float | None
    ops_per_family: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"comp_nodes": self.comp_nodes, "real_values": self.real_values, "zero_values": self.zero_values,
                "gpu_time_covered_pct": self.gpu_time_covered_pct, "ops_per_family": self.ops_per_family}


class LongDelay(msgspec.Struct):
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


class Distribution(msgspec.Struct):
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
        return cls(len(values), sum(values), int(upper_percentile(values, 0.5)), int(upper_percentile(values, 0.9)),
                   values[-1])

    def to_json(self) -> dict[str, int]:
        if not self.count:
            return {"count": 0}
        return {"count": self.count, "total": self.total, "p50": self.p50, "p90": self.p90, "max": self.max}


class Delays(msgspec.Struct):
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


# The reasons (etweave.audit.WHY_NO_DEPENDENT) under which nothing in the graph waits for a collective's end: a
# simulated change of its time moves only what follows it in program and collective order. (The others are
# waited for through program or stream order.)
UNWAITED = frozenset({"not_waited_for", "issuer_resumed_before_its_end"})


def unwaited_collectives(report: dict[str, Any]) -> list[int]:
    """The node ids of a rank's report's collectives that nothing waits for (`UNWAITED`)."""
    return [c["node"] for c in report.get("collectives_without_dependents") or () if c.get("why") in UNWAITED]


class CollectiveWithoutDependents(msgspec.Struct):
    node: int
    name: str
    collective: str
    why: str  # a key of etweave.audit.WHY_NO_DEPENDENT
    through: int | None = None  # waited_for_through_stream: the later op of its stream that was waited for
    resumed: int | None = None  # issuer_resumed_before_its_end: the issuing thread's idle node it resumed after
    before_end_micros: int | None = None  # ... and how long before the collective's record ended it resumed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "name": self.name, "collective": self.collective, "why": self.why}
        if self.through is not None:
            out["through"] = self.through
        if self.resumed is not None:
            out["resumed"], out["before_end_micros"] = self.resumed, self.before_end_micros
        return out


class RecordTailEntry(msgspec.Struct):
    """A collective whose record outlasted it, modelled: it ends where its waiter resumed (docs/FACTS.md §W3)."""

    node: int
    name: str
    record_tail_micros: int  # how long its record stayed open after: its `[record tail]` node

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "name": self.name, "record_tail_micros": self.record_tail_micros}


class Report(msgspec.Struct):
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
    record_tails: list[RecordTailEntry]
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
            "record_tails": [r.to_json() for r in self.record_tails],
        }
        if self.cpu_ops is not None:
            out["cpu_ops"] = self.cpu_ops.to_json()
        return out


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


_SHOWN = 5  # node ids a summary line names before "..."


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
    tails = report.get("record_tails") or []
    if tails:
        out.append(f"  collectives whose record outlasted them (a waiter resumed first): {len(tails)}, each cut at "
                   "that resume (report: record_tails)")
    unwaited = unwaited_collectives(report)
    if unwaited:
        shown = ", ".join(map(str, unwaited[:_SHOWN])) + (", ..." if len(unwaited) > _SHOWN else "")
        out.append(f"  collectives nothing on another thread or stream waited for: {len(unwaited)} (nodes {shown}; "
                   "report: collectives_without_dependents)")
    nonzero = {k: v for k, v in report["warnings"].items() if v}
    out.append("  warnings: " + (", ".join(f"{k}={v}" for k, v in nonzero.items()) if nonzero else "none"))
    if report["collective_type_mapping"]:
        out.append("  collective types mapped for the simulator: " +
                   ", ".join(f"{k} x{v}" for k, v in report["collective_type_mapping"].items()))
    if "note" in report["link"]:
        out.append(f"  note: {report['link']['note']}")
    return "\n".join(out)
