"""The pipeline: read -> link -> repair -> assemble -> collectives -> infer dependencies -> build nodes -> check
-> write. `convert()` is the Python API; `etweave convert` is a thin wrapper around it."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etweave import __version__, progress, roofline
from etweave.assemble import assemble
from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import SCHEMA_VERSION
from etweave.check import NodeChecker, is_group_id
from etweave.collectives import find_collectives
from etweave.deps import Dependencies, infer
from etweave.errors import BadInput, CheckFailed
from etweave.link import HostLink, link_host, mismatch_evidence, select_device
from etweave.model import Graph
from etweave.nodes import build_nodes
from etweave.output import JsonFile, Writer, check_outputs, write_together
from etweave.progress import counted
from etweave.read import widths
from etweave.read.host_et import HostTrace, read_host_et
from etweave.read.kineto import KinetoTrace, read_kineto
from etweave.read.kineto_host import Selection, add_unlinked_cpu_ops, kineto_host, restrict
from etweave.renderers import EtFile
from etweave.repair import repair
from etweave.report import build_report
from etweave.waits import resolve_waits


@dataclass(slots=True)
class Result:
    graph: Graph
    deps: Dependencies
    report: dict[str, Any]
    metadata: pb.GlobalMetadata
    _nodes: list[pb.Node] | None = None

    @property
    def nodes(self) -> list[pb.Node]:
        """Every node, built and checked on first use (`convert` streams them to the file instead)."""
        if self._nodes is None:
            self._nodes = list(self.checked_nodes())
        return self._nodes

    def __repr__(self) -> str:  # the default would print every node and the whole report
        r = self.report
        counts = ", ".join(f"{k} {r[k]['output']}/{r[k]['input']}" for k in
                           ("host_ops", "cpu_ops", "device_ops", "runtime_calls", "collectives") if k in r)
        return (f"Result(rank {r.get('rank')}: {r.get('nodes')} nodes, {r.get('edges', {}).get('total')} edges, "
                f"{counts} (output/input), linked by {r.get('link', {}).get('method')})")

    def checked_nodes(self) -> Iterator[pb.Node]:
        """The nodes one at a time; after the last, the whole graph is checked. A violation is an etweave bug:
        raising there leaves no output, since the writer renames its temporary file only once this ends."""
        rank = self.graph.rank
        checker = NodeChecker(f"rank {rank}")
        for node in build_nodes(self.graph, self.deps):
            checker.add(node)
            yield node
        violations = checker.violations()
        if violations:
            raise RuntimeError(f"output failed its own check: {violations[0]}")


def process_groups(host: HostTrace | None, kineto: KinetoTrace | None) -> dict[str, str]:
    """Trace process-group name -> comm-group id: "" for a group of all ranks, else a decimal id >= 1."""
    groups: list[dict[str, Any]] = []
    if host is not None:
        groups = host.process_groups() or []
    if not groups and kineto is not None:
        cfg = kineto.distributed.get("pg_config")
        groups = cfg if isinstance(cfg, list) else []
    world = kineto.distributed.get("world_size") if kineto is not None else None
    out: dict[str, str] = {}
    subgroups: list[str] = []
    for n, grp in enumerate(g for g in groups if isinstance(g, dict)):
        name = str(grp.get("pg_name", n))
        ranks = grp.get("ranks") or []
        if ranks in ([], "all") or (isinstance(world, int) and len(ranks) == world):
            out[name] = ""
        else:
            subgroups.append(name)
    out.update(assign_group_ids(subgroups))
    return out


def assign_group_ids(names: Sequence[str]) -> dict[str, str]:
    """Comm-group ids for subgroup names, in the order given: a name that is already an id ASTRA-sim accepts
    (decimal, >= 1, no leading zero) keeps it, the others get the smallest free ids from 1 up (FORMATS.md 3b.5:
    CommunicatorGroup asserts id > 0; PyTorch names its default group "0")."""
    ids: dict[str, str] = {}
    for name in names:
        if is_group_id(name) and str(int(name)) == name:
            ids.setdefault(name, name)
    taken = set(ids.values())
    next_id = 1
    for name in names:
        if name in ids:
            continue
        while str(next_id) in taken:
            next_id += 1
        ids[name] = str(next_id)
        taken.add(ids[name])
    return ids


def run_pipeline(host: HostTrace | None, kineto: KinetoTrace | None, rank: int | None = None,
                 select: Selection | None = None, allow_mismatch: bool = False) -> Result:
    """The stages in turn. A host ET and a Kineto trace that the evidence says are not of one run and rank
    raise CheckFailed naming both files, unless `allow_mismatch` (then the report says so)."""
    if host is None and kineto is None:
        raise BadInput("convert", "give a host ET (--host), a Kineto trace (--device), or both")
    if rank is None:
        rank = (kineto.rank if kineto is not None else None) or 0
    widths.rank("--rank", "rank", rank)
    window = None
    mismatch: list[str] = []
    if select is not None:
        if kineto is None:
            raise BadInput("convert", "--steps and --window select part of a Kineto trace: give --device")
        window = select.resolve(kineto)
    with progress.stage("linking host ops to device events"):
        if host is None and kineto is not None:  # Kineto only: its cpu ops stand in for the host ops
            host, link = kineto_host(kineto, window)
        else:
            link = link_host(host, kineto) if host is not None else HostLink("none", {}, {})
            mismatch = mismatch_evidence(host, kineto, link) if host is not None and kineto is not None else []
            if mismatch and not allow_mismatch:
                assert host is not None and kineto is not None
                raise CheckFailed(f"{host.path} and {kineto.path} are not of the same run and rank: "
                                  f"{'; '.join(mismatch)} (--allow-mismatch converts them anyway)")
            if window is not None:
                link.window = restrict(link.window, window)
            if host is not None and kineto is not None:
                add_unlinked_cpu_ops(host, kineto, link)
        device = select_device(kineto, link.window) if kineto is not None else None
    next_id = max((op.id for op in host.ops), default=0) + 1 if host is not None else 1
    rep = None
    with progress.stage("building the graph"):
        if host is not None:
            rep, next_id = repair(host, next_id)
        g = assemble(host, kineto, link, device, rep, next_id, rank)
        g.extra["input_files"] = {"host": host.path if host is not None else None,
                                  "device": kineto.path if kineto is not None else None}
        stats = find_collectives(g, process_groups(host, kineto))
    with progress.stage("inferring dependencies"):
        resolve_waits(g)
        deps = infer(g)
        g.extra["roofline"] = roofline.assign(g)  # read by the report and by build_nodes
        report = build_report(host, kineto, link, device, rep, g, deps, stats)
    if mismatch:  # converted because allowed: say so where the link is described
        report["warnings"]["inputs_mismatched"] = 1
        report["link"]["mismatch"] = mismatch
        report["link"].pop("note", None)  # "the structurally identical iteration" would claim too much
    metadata = pb.GlobalMetadata(version=SCHEMA_VERSION)
    metadata.attr.extend([
        pb.AttributeProto(name="etweave_version", string_val=__version__),
        pb.AttributeProto(name="rank", int64_val=rank),
        pb.AttributeProto(name="source_host", string_val=Path(host.path).name if host else ""),
        pb.AttributeProto(name="source_device", string_val=Path(kineto.path).name if kineto else ""),
    ])
    return Result(g, deps, report, metadata)


def convert(host: Path | None, device: Path | None, out: Path, report_path: Path | None = None,
            rank: int | None = None, select: Selection | None = None, allow_mismatch: bool = False) -> Result:
    """Convert one rank's traces to `out` (and the audit report to `report_path`), both written atomically."""
    outputs = [("-o", Path(out))] + ([("--report", Path(report_path))] if report_path is not None else [])
    check_outputs(outputs, [host, device])  # before any work: a bad output path costs nothing
    with no_gc():
        with progress.stage("reading the host ET"):
            host_trace = read_host_et(Path(host)) if host is not None else None
        with progress.stage("reading the Kineto trace"):
            kineto = read_kineto(Path(device)) if device is not None else None
        result = run_pipeline(host_trace, kineto, rank, select, allow_mismatch)
        nodes = counted(result.checked_nodes(), f"writing {Path(out).name}", result.report.get("nodes"), "nodes")
        # both written together: a failure anywhere leaves neither new nor changed
        writers: list[Writer] = [EtFile(Path(out), result.metadata, nodes)]  # streamed
        if report_path is not None:
            writers.append(JsonFile(Path(report_path), result.report))
        write_together(writers)
    return result


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The pipeline builds millions of acyclic objects: the cyclic collector would rescan them again and again
    (a third of the run time) and free nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
