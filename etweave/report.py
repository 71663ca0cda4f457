"""The audit report: every input op in the output or named, with its reason (see docs/OUTPUT.md)."""

from __future__ import annotations

from typing import Any

from etweave.collectives import CollectiveStats
from etweave.deps import Dependencies, by_name
from etweave.deps.evidence import Evidence
from etweave.fidelity import PathNode, delay_share
from etweave.link import DeviceSelection, HostLink, LeftOut
from etweave.model import DELAY, GPU_KINDS, HOST_OP, RUNTIME, THREAD_ROOT, UNTRACED, WAKEUP, Graph
from etweave.nodes import duration
from etweave.read.host_et import PG_INIT_NAME, HostTrace
from etweave.read.kineto import KinetoTrace
from etweave.repair import Repair
from etweave.roofline import Roofline
from etweave.serialized import serialized
from etweave.waits import NoWaitEvidence

LONG_DELAY = 100.0  # µs: delays on the critical path at least this long are listed with their evidence


def build_report(host: HostTrace | None, kineto: KinetoTrace | None, link: HostLink, device: DeviceSelection | None,
                 rep: Repair | None, g: Graph, deps: Dependencies, stats: CollectiveStats) -> dict[str, Any]:
    # Ops made from Kineto cpu ops are counted as cpu_ops, not as host ET nodes.
    host_in = len(host.ops) - host.from_kineto if host is not None else 0
    from_kineto = {op.id for op in host.ops[len(host.ops) - host.from_kineto:]} if host is not None else set()
    host_out = sum(1 for it in g.items if it.host is not None and it.id not in from_kineto)
    kineto_only = link.method == "kineto"  # the host ops were synthesized from Kineto cpu ops: count those instead
    if kineto_only:
        host_in = host_out = 0
    gpu_out = sum(1 for it in g.items if it.kind in GPU_KINDS)
    runtime_out = sum(1 for it in g.items if it.kind == RUNTIME)
    left_out: list[dict[str, Any]] = []
    if device is not None:
        for (kind, reason), lo in sorted(device.left_out.items()):
            left_out.append({"kind": kind, "reason": reason, "count": lo.count, "examples": lo.examples})
    if stats.unmatched_calls:
        left_out.append({"kind": "collectives", "reason": "no_communication_work_recorded",
                         "count": len(stats.unmatched_calls),
                         "examples": [f"{op.name} (host id {op.id})" for op in stats.unmatched_calls[:5]]})
    warnings: dict[str, int] = {}
    for src in (host.warnings if host else {}, kineto.warnings if kineto else {}, link.warnings):
        warnings.update(src)
    if kineto is not None and host is not None and not kineto_only:
        # `## process_group:init ##` is written when the observer starts: Kineto never has it.
        unlinked = sum(1 for it in g.items if it.kind == HOST_OP and not it.measured and it.name != PG_INIT_NAME)
        warnings["host_ops_unlinked"] = unlinked
    if rep is not None and rep.cycles:
        warnings["host_parent_cycles_broken"] = rep.cycles
    for source, n in sorted(stats.type_fallbacks.items()):
        warnings[f"collective_type_from_{source}"] = n
    warnings["collective_size_unknown"] = stats.size_unknown
    if stats.coalesced_without_metadata:
        warnings["collective_coalesced_without_metadata"] = stats.coalesced_without_metadata
    warnings["gpu_ops_without_launcher"] = sum(1 for it in g.items if it.kind in GPU_KINDS and it.launcher is None) \
        if kineto is not None else 0
    for source, n in sorted(deps.rejected.items()):
        warnings[f"edges_rejected_{source}"] = n
    for source, n in sorted(deps.late.items()):
        warnings[f"wait_edges_ending_late_{source}"] = n
    report: dict[str, Any] = {
        "rank": g.rank,
        "link": {"method": link.method, "seq_offset": link.seq_offset,
                 "threads": {str(k): v for k, v in sorted(link.kthread_of.items())},
                 "window_us": list(link.window) if link.window else None},
        "host_ops": {"input": host_in, "output": host_out},
        "device_ops": {"input": device.gpu_input if device else 0, "output": gpu_out},
        "runtime_calls": {"input": device.runtime_input if device else 0, "output": runtime_out},
        "collectives": {"input": stats.calls, "output": stats.comm_nodes},
        "collective_type_mapping": dict(sorted(stats.mapped.items())),
        "synthesized": {"thread_roots": sum(1 for it in g.items if it.kind == THREAD_ROOT and it.host is None)},
        "left_out": left_out,
        "warnings": dict(sorted(warnings.items())),
        "orphans": {
            "count": len(rep.orphan_parent) if rep else 0,
            "missing_parents": [
                {"id": m.id, "thread": m.thread, "orphans": len(m.orphans), "nodes_below": m.nodes_below,
                 "collectives": m.collectives} for m in (rep.missing if rep else [])
            ],
        },
        "edges": {"total": sum(deps.per_source.values()), "per_source": by_name(deps.per_source),
                  "inferred": by_name(deps.inferred)},
        "nodes": len(g.items),
        "roofline": _roofline(g),
        "delays": delays(g, deps),
        "collectives_without_dependents": collectives_without_dependents(g, deps),
        "astra_sim_serialized": serialized(g),  # concurrent work ASTRA-sim's one slot per class runs in turn
    }
    if kineto is not None:
        cpu_in, cpu_left = _kineto_cpu_ops(kineto, link)
        report["cpu_ops"] = {"input": cpu_in, "output": len(link.event_of)}
        if host is not None and host.from_kineto:
            report["synthesized"]["host_ops_from_kineto"] = host.from_kineto
        if cpu_left.count:
            left_out.append({"kind": "cpu_ops", "reason": "outside_window", "count": cpu_left.count,
                             "examples": cpu_left.examples})
    if kineto_only and kineto is not None:
        report["synthesized"] = {"process_root": 1, "thread_roots": sum(1 for it in g.items if it.kind == THREAD_ROOT)}
    if link.seq_offset:
        report["link"]["note"] = (f"the host ET comes from another iteration than the Kineto trace (sequence numbers "
                                  f"differ by {link.seq_offset}); linked to the structurally identical iteration")
    return report


def _roofline(g: Graph) -> dict[str, Any]:
    """COMP nodes with real num_ops/tensor_size (from their launching op's shapes) and with zeros."""
    rf: Roofline | None = g.extra.get("roofline")
    comp = sum(1 for it in g.items if it.comm is None)
    real = sum(1 for _ops, size in rf.values.values() if size > 0) if rf is not None else 0
    gpu, covered = (rf.gpu_time_us, rf.gpu_time_covered_us) if rf is not None else (0.0, 0.0)
    return {"comp_nodes": comp, "real_values": real, "zero_values": comp - real,
            "gpu_time_covered_pct": round(100.0 * covered / gpu, 2) if gpu > 0 else None,
            "ops_per_family": rf.ops if rf is not None else {}}


def delays(g: Graph, deps: Dependencies) -> dict[str, Any]:
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
            where = {"stream": it.stream} if it.stream is not None else {"tid": str(it.tid)}
            long.append({"node": i, "name": it.name, "kind": it.kind, **where, "start_micros": round(it.start),
                         "micros": d, "evidence": evidence.of(it)})
    wakeups = sorted(duration(it) for it in g.items if it.kind == WAKEUP)
    return {
        "critical_path_micros": round(ds.critical_path),
        "share_percent": round(ds.share, 2),
        "by_kind_micros": {k: round(v) for k, v in ds.by_kind.items()},
        "rank_start_offset_micros": round(ds.rank_start_offset),
        "long_delays_on_critical_path": long,
        "wakeup_micros": _distribution(wakeups),
    }


def _distribution(values: list[int]) -> dict[str, int]:
    if not values:
        return {"count": 0}
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"count": len(values), "total": sum(values), "p50": pick(0.5), "p90": pick(0.9), "max": values[-1]}


def collectives_without_dependents(g: Graph, deps: Dependencies) -> list[dict[str, Any]]:
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
    out = []
    for it in g.items:
        if it.comm is not None and it.id not in gates:
            out.append({"node": it.id, "name": it.name, "collective": it.comm.collective_name})
    return out


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
