"""`etweave convert-run RUN_DIR -o OUT_DIR`: every rank of a run to `.et` files, `comm_group.json` and
`report.json`, with cross-rank checks. The work is in `etweave.run`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from etweave import run as whole_run
from etweave.chakra import et_def_pb2 as pb
from etweave.errors import BadInput

DISCOVERY = """\
Finding the ranks in RUN_DIR:
  - rank<N>/ folders (also rank_<N>, rank-<N>): every *.json / *.json.gz inside is a trace of rank N;
  - files in RUN_DIR with a rank in their name: *rank<N>*.json[.gz] (also rank_<N>, rank-<N>), else
    *_<N>.json[.gz];
  - if neither exists: one host ET and/or one Kineto trace in RUN_DIR are a one-rank run (rank from the
    Kineto distributedInfo, else 0).
Host ET or Kineto is told from the content (first 4 KB): "schema"/"nodes" vs "traceEvents"/"schemaVersion"/
"deviceProperties"/"distributedInfo". Readable JSON that is neither is ignored (listed in report.json). A rank
with only a Kineto trace is converted from it alone. No rank found, or a rank with two host ETs or two Kineto
traces, is bad input (exit 2).

Outputs (written only once every rank converted and every check ran; nothing on failure):
  OUT_DIR/<prefix>.<rank>.et, OUT_DIR/comm_group.json ({"<id>": [global ranks]}; the world group is pg_name ""),
  OUT_DIR/report.json (every rank's audit, process groups, cross-rank checks, duration adjustments).
  Meanwhile each rank's stream waits on disk in OUT_DIR (a .etweave-run-*/ spool folder, then a staged
  .<prefix>.<rank>.et.tmp-<pid>), never all ranks in memory; a killed run's are removed by the next run into OUT_DIR.
Cross-rank: in each process group every member rank must issue the same collectives (kind, order, comm_seq,
and size for all_reduce/all_gather/reduce_scatter/broadcast), sends and receives must pair. A mismatch exits 3
naming the first divergence per rank, unless --allow-mismatch. A rank whose host ET and Kineto trace are not of
one run and rank (linked share, Record function ids, process ids) exits 3 too, unless --allow-mismatch.
Collective durations become end (less attr record_tail_micros, where the record outlasted the collective) minus
the latest start among the group's members (attr transfer_duration_micros; measured_duration_micros keeps the
measured).

Exit codes: 0 ok, 2 bad input, 3 ranks disagree or a check failed."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("convert-run", help="convert every rank of a run folder, with cross-rank checks",
                       description="Convert all ranks of a distributed run to Chakra .et files, with a shared "
                                   "comm_group.json, an audit report and cross-rank collective checks.",
                       epilog=DISCOVERY, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="folder with the run's traces (see below)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="OUT_DIR", help="output folder")
    p.add_argument("--prefix", default="trace", help="output file names <prefix>.<rank>.et (default: trace)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="write the outputs (exit 0) even when ranks issue different collectives or a rank's host ET "
                        "and Kineto trace look like different runs; the report says so")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="ranks converted at once in a process pool (default: the CPUs available; 1 = serial)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="convert the ranks on this Dask distributed scheduler (tcp://host:8786) instead; its "
                        "workers must see RUN_DIR at the same path")
    p.add_argument("--explain", type=_rank_node, metavar="RANK:NODE_ID", action="append", default=[],
                   help="print that node of the rank's output: its predecessors and the evidence for each, as "
                        "written in the file (repeatable)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success, no progress")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise BadInput("--jobs", "must be at least 1")
    if args.jobs is not None and args.scheduler is not None:
        raise BadInput("--jobs", "give --jobs or --scheduler, not both")

    def show(result: whole_run.RunResult) -> None:
        # Printed before a divergence fails the run, so the per-rank lines come with the reason.
        if not args.quiet or not result.consistent:
            for line in whole_run.summary(result):
                print(line)

    result = whole_run.convert_run(args.run_dir, args.output, args.prefix, args.allow_mismatch, args.jobs,
                                   args.scheduler, progress=True, on_ranks=show)
    if not args.quiet:
        print(f"wrote {args.output}/{args.prefix}.<rank>.et, {whole_run.COMM_GROUP_FILE}, {whole_run.REPORT_FILE}")
    for rank, node_id in args.explain:
        if rank not in result.ranks:
            raise BadInput("--explain", f"rank {rank} is not in this run (ranks {sorted(result.ranks)})")
        print(explain_node(rank, result.ranks[rank][1], node_id))
    return 0


def _rank_node(text: str) -> tuple[int, int]:
    rank, sep, node = text.partition(":")
    if not sep or not rank.strip().isdigit() or not node.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not RANK:NODE_ID (two integers, e.g. 0:42)")
    return int(rank), int(node)


def explain_node(rank: int, nodes: Sequence[pb.Node], node_id: int) -> str:
    """A node of a written rank and its predecessors with the evidence the file records (attr dep_evidence,
    aligned with data_deps). An id the rank does not have is bad input."""
    by_id = {n.id: n for n in nodes}
    node = by_id.get(node_id)
    if node is None:
        raise BadInput("--explain", f"rank {rank} has no node {node_id} (its ids: {min(by_id, default=0)} to "
                                    f"{max(by_id, default=0)}, with gaps)")
    attrs = {a.name: a for a in node.attr}
    kind = attrs["kind"].string_val if "kind" in attrs else pb.NodeType.Name(node.type)
    evidence = list(attrs["dep_evidence"].string_list.values) if "dep_evidence" in attrs else []
    lines = [f"rank {rank} node {node_id} {node.name!r} ({kind}, start {node.start_time_micros} us, duration "
             f"{node.duration_micros} us):"]
    if not node.data_deps and not node.ctrl_deps:
        lines.append("  no predecessors (first op of its thread or stream)")
    for i, dep in enumerate(node.data_deps):
        src = by_id.get(dep)
        how = evidence[i] if i < len(evidence) else "unknown"
        lines.append(f"  <- {dep} {src.name[:60] if src else '?'!r} by {how} (data dep)")
    for dep in node.ctrl_deps:
        src = by_id.get(dep)
        lines.append(f"  <- {dep} {src.name[:60] if src else '?'!r} (ctrl dep)")
    return "\n".join(lines)
