"""`etweave check OUT_DIR | FILE.et ...`: check that .et files will load and run in ASTRA-sim.

Exit 0 when clean, 3 on any violation, 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import msgspec
import orjson
from msgspec import field
from msgspec.structs import replace

from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.chakra.io import GZIP_MAGIC, et_files, read_et
from etweave.check import EncodedNodes, Violation, check_metadata, check_nodes, check_run
from etweave.errors import BadInput
from etweave.progress import counted
from etweave.runfolder import comm_groups_for, file_rank, lone_file_rank, rank_disagreement
from etweave.simulate.coverage import missing_ranks, run_ranks

EXIT_OK, EXIT_CHECK = 0, 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="check .et files against what ASTRA-sim requires",
                       description="Check Chakra .et files against what ASTRA-sim does with them (docs/FACTS.md §A): "
                                   "ids, both edge sets, cycles, node types (no METADATA_NODE), attr types, "
                                   "num_ops/tensor_size on every COMP_NODE, collectives, process-group ids >= 1, "
                                   "send/recv pairing. Warnings (comm_size 0, a single rank, MEM nodes) are "
                                   "listed with counts and do not fail. Exit 0 clean, 3 on violations, 2 on bad "
                                   "input.")
    p.add_argument("paths", type=Path, nargs="+", metavar="OUT_DIR_or_FILE",
                   help="a folder (every *.et and *.et.gz in it) or .et files named <prefix>.<rank>.et (the rank; "
                        "a name without one: the GlobalMetadata attr rank); the comm_group.json beside them is "
                        "read (a gzipped .et is read, with a warning: ASTRA-sim reads no gzip)")
    p.add_argument("--comm-group", type=Path, metavar="FILE",
                   help="the comm-group JSON map (overrides the comm_group.json beside the files)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--max-per-rule", type=int, default=50, metavar="N",
                   help="show at most N violations of each rule (default 50, 0 = all); counts stay exact")
    p.set_defaults(run=run)


class _Findings(msgspec.Struct):
    """What reading and checking the files found."""

    violations: list[Violation] = field(default_factory=list)
    notes: list[Violation] = field(default_factory=list)
    warnings: list[Violation] = field(default_factory=list)  # runs in ASTRA-sim, but not as measured: never a failure
    rank_files: dict[int, Path] = field(default_factory=dict)
    nodes: int = 0
    partial: bool = False  # ranks of the run are missing (a note names them)


def run(args: argparse.Namespace) -> int:
    files = et_files(args.paths)
    # the rules simulate reads a folder by (etweave.runfolder): where the map is, its keys, each file's rank
    group_file, comm_group = comm_groups_for(files, args.comm_group)
    found = _check_files(files, comm_group)
    limit = args.max_per_rule if args.max_per_rule > 0 else None
    if args.json:
        _print_json(found, files, group_file, limit)
    else:
        _print_lines(found, len(files), limit)
    return EXIT_CHECK if found.violations else EXIT_OK


def _check_files(files: list[Path], comm_group: dict[str, list[int]] | None) -> _Findings:
    found = _Findings()
    # Only comm nodes go on to the cross-rank checks, so each file's other nodes can be freed once checked; they
    # wait encoded (EncodedNodes): 79 -> 49 MB peak RSS at 1024 dlrm ranks
    comm_nodes: dict[int, list[bytes]] = {}
    rank_files = found.rank_files
    for path in counted(files, "checking", len(files), "files", chunk=1):
        _warn_if_gzip(path)
        metadata, nodes = read_et(path)
        rank = file_rank(metadata, path, lone_file_rank(files))
        renamed = rank_disagreement(metadata, path)
        if renamed is not None:
            found.warnings.append(Violation("rank-name", str(path), renamed))
        if rank in rank_files:
            raise BadInput(path, f"rank {rank} again (also {rank_files[rank]}); give one run's files at a time")
        rank_files[rank] = path
        found.nodes += len(nodes)
        found.violations.extend(check_metadata(metadata, str(path)))
        found.violations.extend(check_nodes(nodes, str(path), found.warnings))
        comm_nodes[rank] = [n.SerializeToString() for n in nodes if n.type in COMM_NODE_TYPES]
        del nodes

    # check_run names ranks; show the file instead, which also names the rank.
    def located(v: Violation) -> Violation:
        rank = v.where.removeprefix("rank ")
        if rank.isdigit() and int(rank) in rank_files:
            return replace(v, where=str(rank_files[int(rank)]))
        return v

    found.violations.extend(located(v) for v in check_run(EncodedNodes(comm_nodes), comm_group, found.notes,
                                                          found.warnings))
    missing = missing_ranks(sorted(rank_files), run_ranks(files))
    if missing is not None:  # a part of a run checks clean on its own, but is not the run
        found.notes.append(Violation("missing-ranks", str(files[0].parent), missing))
        found.partial = True
    found.notes = [located(v) for v in found.notes]
    found.warnings = [located(v) for v in found.warnings]
    return found


def _print_json(found: _Findings, files: list[Path], group_file: Path | None, limit: int | None) -> None:
    report = {
        "ok": not found.violations,
        "partial_run": found.partial,
        "files": [str(p) for p in files],
        "comm_group": str(group_file) if group_file is not None else None,
        "nodes": found.nodes,
        "counts": dict(sorted(Counter(v.rule for v in found.violations).items())),
        "violations": [v.to_json() for v in _capped(found.violations, limit)],
        "notes": [v.to_json() for v in found.notes],
        "warning_counts": dict(sorted(Counter(v.rule for v in found.warnings).items())),
        "warnings": [v.to_json() for v in _capped(found.warnings, limit)],
    }
    sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")


def _print_lines(found: _Findings, files: int, limit: int | None) -> None:
    counts = Counter(v.rule for v in found.violations)
    warning_counts = Counter(v.rule for v in found.warnings)
    for v in _capped(found.violations, limit):
        print(v)
    for rule, count in sorted(counts.items()):
        if limit is not None and count > limit:
            print(f"... {count - limit} more {rule} violation(s) not shown (--max-per-rule 0 shows all)")
    for v in found.notes:
        print(f"note: {v}")
    for v in _capped(found.warnings, limit):
        print(f"warning: {v}")
    for rule, count in sorted(warning_counts.items()):
        print(f"warnings: {rule} {count}" + (f" ({count - limit} not shown)" if limit is not None
                                              and count > limit else ""))
    print(_summary(files, found.nodes, counts, len(found.notes), sum(warning_counts.values()), found.partial))


def _warn_if_gzip(path: Path) -> None:
    """etweave and Chakra's tools read gzip, ASTRA-sim's feeder does not: say so, but check the content."""
    if not path.is_file():  # a pipe (its bytes are read_et's) or a device (refused there): no peeking
        return
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
    except OSError:
        return  # read_et says why, as bad input
    if gz:
        print(f"etweave: warning: {path} is gzip-compressed: ASTRA-sim's feeder reads no gzip, gunzip it "
              "before simulating with ASTRA-sim", file=sys.stderr)


def _capped(violations: list[Violation], limit: int | None) -> list[Violation]:
    if limit is None:
        return violations
    seen: Counter[str] = Counter()
    shown: list[Violation] = []
    for v in violations:
        seen[v.rule] += 1
        if seen[v.rule] <= limit:
            shown.append(v)
    return shown



def _summary(files: int, nodes: int, counts: Counter[str], notes: int, warnings: int, partial: bool = False) -> str:
    head = f"etweave check: {files} file(s), {nodes} node(s): "
    tail = (f"; {warnings} warning(s)" if warnings else "") + (f"; {notes} note(s)" if notes else "")
    if not counts:
        return head + ("clean, but only part of the run (ranks missing: see the note)" if partial else "clean") + tail
    rules = ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items()))
    return head + f"{sum(counts.values())} violation(s) ({rules})" + tail
