"""The pipeline: read -> link -> repair -> assemble -> collectives -> infer dependencies -> roofline -> audit,
then build nodes -> check -> write. `STAGES` are applied in turn to one `Conversion`; `convert()` is the Python
API; `etweave convert` is a thin wrapper around it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from etweave import progress, roofline
from etweave.assemble import assemble
from etweave.audit import build_report
from etweave.chakra.io import SCHEMA_VERSION, framed_et_chunks
from etweave.check import NodeChecker, RisingKeys
from etweave.collectives import find_collectives
from etweave.conversion import Conversion, need
from etweave.deps import Dependencies, infer
from etweave.errors import CheckFailed
from etweave.link import (
    HostLink,
    Selection,
    add_unlinked_cpu_ops,
    kineto_host,
    link_host,
    mismatch_evidence,
    restrict,
    select_device,
)
from etweave.model import Graph
from etweave.nodes import EncodedNodes, Rounded, encode_metadata, encode_nodes
from etweave.nogc import no_gc
from etweave.output import FileBytes, JsonFile, Writer, check_outputs, write_together
from etweave.process_groups import local_group_ids
from etweave.read.host_et import HostTrace, read_host_et
from etweave.read.kineto import KinetoTrace, read_kineto
from etweave.repair import repair
from etweave.report import Report
from etweave.roofline import Roofline
from etweave.version import __version__
from etweave.waits import resolve_waits

if TYPE_CHECKING:
    from etweave.chakra import et_def_pb2 as pb


class Result(msgspec.Struct):
    graph: Graph
    deps: Dependencies
    report: dict[str, Any]  # the audit as JSON: `audit.to_json()`
    metadata_bytes: bytes  # the GlobalMetadata, encoded (`metadata` decodes it)
    audit: Report
    roofline: Roofline  # num_ops / tensor_size of GPU COMP nodes
    group_ids: dict[str, str]  # trace process-group name -> the comm-group id this rank's nodes carry
    # every item's start and length rounded (the audit's), in item order; let go once the nodes are encoded (their
    # self-check's memory is the conversion's peak), made again if they are encoded again
    times: Rounded | None
    _nodes: list[pb.Node] | None = None

    @classmethod
    def of(cls, c: Conversion) -> Result:
        """The result of a conversion whose stages have all run."""
        audit = need(c.report, "report")
        metadata = encode_metadata(SCHEMA_VERSION, [
            ("etweave_version", __version__),
            ("rank", c.rank),
            ("source_host", Path(c.host.path).name if c.host else ""),
            ("source_device", Path(c.kineto.path).name if c.kineto else ""),
        ])
        return cls(need(c.graph, "graph"), need(c.deps, "dependencies"), audit.to_json(), metadata, audit,
                   need(c.roofline, "roofline"), c.group_ids, need(c.times, "times"))

    @property
    def metadata(self) -> pb.GlobalMetadata:
        """The GlobalMetadata as a protobuf object (the Python API, tests)."""
        from etweave.chakra import et_def_pb2 as pb  # here: converting needs no protobuf object

        return pb.GlobalMetadata.FromString(self.metadata_bytes)

    @property
    def nodes(self) -> list[pb.Node]:
        """Every node, built and checked on first use (`convert` streams them to the file instead)."""
        if self._nodes is None:
            self._nodes = list(self.checked_nodes())
        return self._nodes

    def __repr__(self) -> str:  # the default would print every node and the whole report
        a = self.audit
        kinds = [("host_ops", a.host_ops), ("cpu_ops", a.cpu_ops), ("device_ops", a.device_ops),
                 ("runtime_calls", a.runtime_calls), ("collectives", a.collectives)]
        counts = ", ".join(f"{kind} {n.output}/{n.input}" for kind, n in kinds if n is not None)
        return (f"Result(rank {a.rank}: {a.nodes} nodes, {a.edges.total} edges, {counts} (output/input), "
                f"linked by {a.link.method})")

    def checked_nodes(self) -> Iterator[pb.Node]:
        """The nodes one at a time as protobuf objects, checked as `encoded_nodes`."""
        from etweave.chakra import et_def_pb2 as pb

        for data in self.encoded_nodes():
            yield pb.Node.FromString(data)

    def encoded_nodes(self) -> Iterator[bytes]:
        """Each node's protobuf bytes in turn; after the last, the whole graph is checked. A violation is an
        etweave bug: raising there leaves no output, since the writer renames its temporary file only once this
        ends."""
        nodes = encode_nodes(self.graph, self.deps, self.roofline, self.times)
        return itertools.chain(nodes, self._self_check(nodes))  # (a chain: no generator step per node)

    def framed_nodes(self, done: Callable[[int], object] | None = None) -> Iterator[bytes]:
        """`encoded_nodes` as the .et stream has them after its GlobalMetadata, in chunks (`EncodedNodes.framed`;
        `done` told each chunk's count of nodes), checked after the last the same way."""
        nodes = encode_nodes(self.graph, self.deps, self.roofline, self.times)
        return itertools.chain(nodes.framed(done), self._self_check(nodes))

    def _self_check(self, nodes: EncodedNodes) -> Iterator[bytes]:
        """Checks the nodes once all are encoded; yields none."""
        self.times = nodes.times = None
        g = self.graph
        checker = NodeChecker(f"rank {g.rank}")
        checker.add_encoded(g.items, nodes.ids, nodes.data_deps, nodes.in_full)
        # every edge rises in (start, pos, id) (deps.order_key, but for roots first on equal starts): the proof of
        # acyclicity the graph check looks for first, on the starts and, where an edge's ends start at once, the
        # whole keys
        by_id = g.by_id
        violations = checker.violations(RisingKeys(nodes.starts, lambda i: _ORDER_KEY(by_id[i])))
        if violations:
            raise RuntimeError(f"output failed its own check: {violations[0]}")
        yield from ()


_ORDER_KEY = attrgetter("start", "pos", "id")


# The stages, each a small function of the conversion: it reads what earlier stages set and sets its own field.

def link(c: Conversion) -> None:
    """Host ops to Kineto events (or the Kineto cpu ops as host ops), and the ops the graph is built from. A host ET
    and a Kineto trace that the evidence says are not of one run and rank raise CheckFailed naming both files,
    unless `allow_mismatch` (then the report says so)."""
    host, kineto = c.host, c.kineto
    if host is None:
        assert kineto is not None  # Conversion.start refuses neither
        # Kineto only, every item's name (and a host op's or runtime call's thread) is its event's: one object each
        kineto.events.share_strings()
        c.ops, c.link = kineto_host(kineto, c.window, c.ids)  # Kineto only: its cpu ops stand in for the host ops
        return
    c.ops = host.ops
    if kineto is None:
        c.link = HostLink("none", {}, {})
        return
    c.link = link_host(host, kineto)
    c.mismatch = mismatch_evidence(host, kineto, c.link)
    if c.mismatch and not c.allow_mismatch:
        raise CheckFailed(f"{host.path} and {kineto.path} are not of the same run and rank: "
                          f"{'; '.join(c.mismatch)} (--allow-mismatch converts them anyway)")
    if c.window is not None:
        c.link.window = restrict(c.link.window, c.window)
    c.added_ops = add_unlinked_cpu_ops(host, kineto, c.link, c.ids)
    if c.added_ops:
        c.ops = [*host.ops, *c.added_ops]


def select_device_events(c: Conversion) -> None:
    if c.kineto is not None:
        c.device = select_device(c.kineto, need(c.link, "link").window)


def repair_parents(c: Conversion) -> None:
    c.repair = repair(c.ops, c.ids)


def build_graph(c: Conversion) -> None:
    c.graph = assemble(c)


def mark_collectives(c: Conversion) -> None:
    c.group_ids = local_group_ids(c.host, c.kineto)
    c.collectives = find_collectives(need(c.graph, "graph"), c.group_ids)


def infer_dependencies(c: Conversion) -> None:
    g = need(c.graph, "graph")
    resolve_waits(g)
    c.deps = infer(g)


def assign_roofline(c: Conversion) -> None:
    c.roofline = roofline.assign(need(c.graph, "graph"))


def audit(c: Conversion) -> None:
    c.times = Rounded.of(need(c.graph, "graph").items)  # rounded once: the audit's passes and the encoder read them
    c.report = build_report(c)


class Stage(msgspec.Struct, frozen=True):
    run: Callable[[Conversion], None]
    progress: str  # what the progress line says while it runs; stages in a row with one label share the line

    @property
    def name(self) -> str:
        return self.run.__name__


_LINKING, _BUILDING, _INFERRING = "linking host ops to device events", "building the graph", "inferring dependencies"
STAGES: list[Stage] = [
    Stage(link, _LINKING), Stage(select_device_events, _LINKING),
    Stage(repair_parents, _BUILDING), Stage(build_graph, _BUILDING), Stage(mark_collectives, _BUILDING),
    Stage(infer_dependencies, _INFERRING), Stage(assign_roofline, _INFERRING), Stage(audit, _INFERRING),
]


def run_pipeline(host: HostTrace | None, kineto: KinetoTrace | None, rank: int | None = None,
                 select: Selection | None = None, allow_mismatch: bool = False, release_inputs: bool = False
                 ) -> Result:
    """The stages in turn on one conversion of these inputs (see `Conversion.start` and `link`). `release_inputs`:
    the caller hands the traces over, and what of them only the stages up to assemble read is let go once assemble
    has made the items (`Conversion.let_go_of_inputs`)."""
    c = Conversion.start(host, kineto, rank, select, allow_mismatch)
    c.inputs_handed_over = release_inputs
    run_stages(c)
    return Result.of(c)


def run_stages(c: Conversion, stages: Sequence[Stage] = STAGES) -> None:
    """Each stage in turn, under its progress line."""
    for label, in_turn in itertools.groupby(stages, key=lambda s: s.progress):
        with progress.stage(label):
            for s in in_turn:
                s.run(c)


def convert_files(host: Path | None, device: Path | None, rank: int | None = None, select: Selection | None = None,
                  allow_mismatch: bool = False) -> Result:
    """Read one rank's traces and run the stages on them; nothing is written."""
    with progress.stage("reading the host ET"):
        host_trace = read_host_et(Path(host)) if host is not None else None
    with progress.stage("reading the Kineto trace"):
        kineto = read_kineto(Path(device)) if device is not None else None
    return run_pipeline(host_trace, kineto, rank, select, allow_mismatch, release_inputs=True)


def convert(host: Path | None, device: Path | None, out: Path, report_path: Path | None = None,
            rank: int | None = None, select: Selection | None = None, allow_mismatch: bool = False) -> Result:
    """Convert one rank's traces to `out` (and the audit report to `report_path`), both written atomically."""
    outputs = [("-o", Path(out))] + ([("--report", Path(report_path))] if report_path is not None else [])
    check_outputs(outputs, [host, device])  # before any work: a bad output path costs nothing
    with no_gc():
        result = convert_files(host, device, rank, select, allow_mismatch)
        with progress.stage(f"writing {Path(out).name}", result.audit.nodes, "nodes") as writing:
            chunks = framed_et_chunks(Path(out), result.metadata_bytes, result.framed_nodes(writing.advance))
            # both written together: a failure anywhere leaves neither new nor changed
            writers: list[Writer] = [FileBytes(Path(out), chunks)]
            if report_path is not None:
                writers.append(JsonFile(Path(report_path), result.report))
            write_together(writers)
    return result
