"""`etweave convert`: one rank's host ET and/or Kineto trace to a Chakra .et file and an audit report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from etweave.errors import BadInput

if TYPE_CHECKING:
    from etweave.convert import Result


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("convert", help="convert one rank's traces to a Chakra .et file",
                       description="Convert a PyTorch host execution trace and/or Kineto trace of one rank. "
                       "With only --device, the Kineto cpu ops stand in for the host ET's ops.")
    p.add_argument("--host", type=Path, help="host execution trace (.json or .json.gz; a file or a pipe)")
    p.add_argument("--device", type=Path, help="Kineto trace (.json or .json.gz; a file or a pipe)")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="output .et file (a name ending in .gz writes it gzip-compressed, as Chakra's tools read "
                   "it; ASTRA-sim's feeder reads only plain .et)")
    p.add_argument("--report", type=Path, help="write the audit report (JSON) here")
    p.add_argument("--rank", type=int, help="this rank's global rank (default: from the Kineto trace, else 0)")
    p.add_argument("--explain", type=int, metavar="NODE_ID", action="append", default=[],
                   help="print the node's predecessors and the evidence for each (repeatable)")
    p.add_argument("--steps", metavar="A:B",
                   help="convert only ProfilerStep#A through #B inclusive (A alone: one step). With --host: "
                   "only the device events of the linked window that lie within those steps")
    p.add_argument("--window", metavar="START:END",
                   help="convert only what starts in this time window (µs, Kineto clock; either side may be "
                   "empty). With --host: as --steps")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="convert even when the host ET and the Kineto trace look like different runs or ranks "
                        "(exit 3 otherwise; the evidence: process ids, Record function ids, linked share)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success, no progress")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.host is None and args.device is None:
        raise BadInput("convert", "give --host, --device, or both")
    from etweave.nogc import no_gc
    from etweave.read.source import reading_ahead

    # The traces are read (and gunzipped) on threads while the pipeline's modules import.
    with reading_ahead([p for p in (args.host, args.device) if p is not None]):
        with no_gc():
            from etweave.convert import convert
            from etweave.link import Selection
        select = Selection.parse(args.steps, args.window)
        result = convert(args.host, args.device, args.output, args.report, args.rank, select, args.allow_mismatch)
    if not args.quiet:
        from etweave.report import summary

        print(summary(result.report))
    absent = [i for i in args.explain if i not in result.graph.by_id]
    if absent:  # the output is written and complete; the question was about a node it does not have
        raise BadInput("--explain", f"node {absent[0]} is not in the output {args.output} (its ids: "
                                    f"{min(result.graph.by_id, default=0)} to {max(result.graph.by_id, default=0)}, "
                                    "with gaps)")
    for node_id in args.explain:
        print(explain(result, node_id))
    return 0


def explain(result: Result, node_id: int) -> str:
    g, deps = result.graph, result.deps
    it = g.by_id.get(node_id)
    if it is None:
        return f"node {node_id}: not in the output"
    lines = [f"node {node_id} {it.name!r} ({it.kind}, start {it.start:.3f} us, duration {it.excl:.3f} us):"]
    preds = deps.preds.get(node_id, ())
    if not preds:
        lines.append("  no predecessors (first op of its thread or stream)")
    for e in preds:
        src = g.by_id[e.src]
        how = "inferred" if e.inferred else "recorded"
        lines.append(f"  <- {e.src} {src.name[:60]!r} ({src.kind}) by {e.source} ({how})")
    return "\n".join(lines)
