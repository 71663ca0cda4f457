"""`etweave simulate TRACE.et [more ranks...]`: replay .et files event by event and compare with the measured run.

Exit 0 when the replay finishes, 3 on a deadlock (nodes that can never start), 2 on bad input (what-if edits
included: etweave/simulate/whatif.py).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

import msgspec

from etweave.api import Simulation
from etweave.chakra.io import et_files
from etweave.commands import simulate_astra
from etweave.cpus import default_jobs
from etweave.errors import BadInput, CheckFailed
from etweave.output import check_outputs, write_together
from etweave.progress import stage
from etweave.renderers import WRITTEN_KEYS, Rendered, ReplayRenderer, Window, replay_renderer, summary_renderer
from etweave.runfolder import comm_groups_for, lone_file_rank
from etweave.simulate import coverage
from etweave.simulate.engine import RankGraph, Replay
from etweave.simulate.load import COMM_GROUP_FILE, load_ranks, replay_files
from etweave.simulate.metrics import deadlock_report, format_deadlock, summarize
from etweave.simulate.pool import MIN_FILES
from etweave.simulate.steps import step_times_in
from etweave.simulate.whatif import Edit, apply, describe, parse_edit

RULES = """\
Replay rules: a node starts when all its data_deps and ctrl_deps are done and its resource is free. Resource:
GPU stream (attrs device, stream), else CPU thread (attr tid), else none (unlimited). Several ready nodes on one
resource: the one ready first goes first, ties by lowest id. A collective holds its resource from issue, starts
on all members given when the last one issues it, and lasts transfer_duration_micros (else duration_micros);
the k-th collective of a pg on each rank (ascending id) match. The k-th send S->D with tag T matches the k-th
recv on D from S with tag T; sends never wait; a recv ends at max(own start + duration, send start + send
duration). Ranks come from the GlobalMetadata attr rank, else the file name <prefix>.<rank>.et.

What-if edits (--scale, --set-duration, --comm-bandwidth; repeatable, applied in the order given) change
durations after loading and before the replay; measured times stay those of the run the files came from.
SELECTOR is key=value terms joined by ',' that must all hold:
  name=GLOB   an op whose name matches (fnmatch), with its [self]/[resumed] parts
  kind=K      cpu (host ops, runtime calls; never delays), gpu (kernels, GPU copies/memsets), comm,
              or a value of the node attr kind (host_op, delay, ...)
  rank=LIST   global ranks, e.g. 0,2-3
  step=LIST   nodes whose measured start lies inside ProfilerStep#N of their rank
An edit that selects no node is bad input (exit 2). Examples:
  --scale 'name=aten::mm*:2'                           every aten::mm* op twice as long
  --scale 'kind=gpu,rank=3:0.5'                        rank 3's GPU work twice as fast
  --set-duration 'name=straggle,rank=0,step=2:25000'   that op lasts 25 ms in all
  --comm-bandwidth 2                                   communication twice as fast (also '[SELECTOR:]FACTOR')
--comm-bandwidth fits, per (process group, collective kind), the graph's transfer times as latency + bytes x
time per byte (robust: the median time of each size, the median slope and intercept), and takes from each
selected comm node the bandwidth time a FACTOR times faster network saves: duration - bytes x time per byte x
(1 - 1/FACTOR); its latency and its own deviation from the fit stay (FACTOR 1 changes nothing); with one size,
or times that do not grow with size, all of it is bandwidth; a node without comm_size is divided by FACTOR and
counted. The per-node form, each node's own time / FACTOR, is --scale 'kind=comm:X' with X = 1/FACTOR.
Printed beside the measured ones: each ProfilerStep's simulated time (else the whole span's), and per edit
the ops and nodes it changed and the us it added."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="replay .et files event by event and compare with the measured timeline",
                       description="Replay Chakra .et files (one per rank) and compare the simulated timeline with "
                                   "the measured one. Exit 0 ok, 3 on a deadlock, 2 on bad input.",
                       epilog=RULES + "\n\n" + simulate_astra.HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", type=Path, nargs="+", metavar="TRACE.et",
                   help="one .et (or .et.gz) file per rank, or a folder: every *.et and *.et.gz in it")
    p.add_argument("--comm-group", type=Path, metavar="FILE",
                   help=f"process-group map (default: {COMM_GROUP_FILE} beside the traces)")
    p.add_argument("--timeline", type=Path, metavar="OUT.json",
                   help="write a Chrome/Perfetto trace with the measured and simulated timelines: a track per thread "
                        "and stream, one slice per op nested as the call stack, the critical path marked and "
                        "drawn as flow arrows (docs/OUTPUT.md)")
    p.add_argument("--plot", type=Path, metavar="OUT.png",
                   help="write a PNG of measured vs simulated per rank and resource, in ms after the run's first "
                        "measured start (needs matplotlib: the plot extra)")
    p.add_argument("--plot-ranks", metavar="LIST", help="--plot and --breakdown: only these ranks, e.g. 0,2-3")
    p.add_argument("--plot-window", metavar="START:END",
                   help="--plot: only this time range, ms after the run's first measured start (either side may "
                        "be empty)")
    p.add_argument("--breakdown", type=Path, metavar="OUT.png",
                   help="write a PNG of each rank's steps split into compute, communication overlapped by compute, "
                        "exposed communication and idle, simulated and measured (needs matplotlib; "
                        "etweave/simulate/breakdown.py says how)")
    p.add_argument("--csv", type=Path, metavar="OUT.csv",
                   help="write one row per node: measured and simulated times, start error, critical-path order "
                        "and contribution (the whole path)")
    p.add_argument("--steps-csv", type=Path, metavar="OUT.csv",
                   help="write one row per rank and ProfilerStep#N: measured and simulated span (a rank without "
                        "profiler steps: one row for the whole rank)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--jobs", type=int, metavar="N",
                   help=f"files read at once in a process pool, from {MIN_FILES} files on (default: the CPUs "
                        "available; 1 = in this process)")
    simulate_astra.add_arguments(p)
    what_if = p.add_argument_group("what-if edits (see below)")
    what_if.add_argument("--scale", action=_EditAction, metavar="SELECTOR:FACTOR",
                         help="multiply the selected nodes' durations by FACTOR")
    what_if.add_argument("--set-duration", action=_EditAction, metavar="SELECTOR:MICROS",
                         help="each selected op lasts MICROS us in all (spread over its node and parts)")
    what_if.add_argument("--comm-bandwidth", action=_EditAction, metavar="[SELECTOR:]FACTOR",
                         help="communication FACTOR times as fast, from a robust fit of the transfer times "
                              "(below)")
    p.set_defaults(run=run, edits=[])


class _EditAction(argparse.Action):
    """Collect every what-if option, of any kind, in one list in command-line order."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        namespace.edits = [*namespace.edits, (self.dest.replace("_", "-"), str(values))]


# Output options: (option, attribute of the parsed arguments, summary key), in the order they are checked and
# named in the text summary. Each is written by the renderer `_renderers` gives its key.
# each output file: its option, and its key in args, in the renderers and in the summary (renderers' WRITTEN_KEYS)
OUTPUT_OPTIONS = tuple(("--" + key.replace("_", "-"), key) for key in WRITTEN_KEYS)
WRITE_ORDER = ("timeline", "csv", "steps_csv", "plot", "breakdown")  # the order --json has always listed them


class Options(msgspec.Struct, frozen=True):
    """The command line after every check, made before any file is loaded."""

    files: list[Path]
    edits: list[Edit]
    outputs: dict[str, tuple[Path, ReplayRenderer]]  # summary key -> (file, its renderer), in WRITE_ORDER


def run(args: argparse.Namespace) -> int:
    # the loaders build millions of acyclic records: the cyclic collector would rescan them and free nothing
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        if enabled:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    options = check_options(args)
    group_file, found = comm_groups_for(options.files, args.comm_group)
    groups = found or {}
    if args.model == "astra-sim":
        return _run_astra(args, options.files, groups)
    ranks = load_ranks(options.files, lone_file_rank(options.files), args.jobs or default_jobs())
    # before the edits, which change durations: what the files hold
    unadjusted = coverage.unadjusted_collectives(ranks)
    applied = apply(ranks, options.edits)
    with stage("replaying"):
        result = replay_files(ranks, groups, options.files, group_file)
    if result.stuck_count:
        if args.json:
            _print(summary_renderer("json").render({"deadlock": deadlock_report(result)}))
        raise CheckFailed(format_deadlock(result))
    with stage("summarizing"):
        summary = _summary(result, ranks, options.files, unadjusted)
    if applied:
        summary["whatif"] = describe(applied)
    _write_outputs(Simulation(result, summary), options)
    summary.update({key: str(path) for key, (path, _) in options.outputs.items()})
    _print(summary_renderer("json" if args.json else "text").render(summary))
    return 0


def _write_outputs(simulation: Simulation, options: Options) -> None:
    """Every output asked for, through its renderer, all written or none. The node details are read from the
    files once, by the first output that needs them."""
    if options.outputs:
        with stage("writing " + ", ".join(str(path) for path, _ in options.outputs.values())):
            write_together([Rendered(path, renderer, simulation) for path, renderer in options.outputs.values()],
                           options.files)


def check_options(args: argparse.Namespace) -> Options:
    """Every option checked before any work, in one place: options of the other model, the plot's choices,
    every output path (writable, not an input, distinct), the what-if edits' syntax."""
    _check_model_options(args)
    if args.jobs is not None and args.jobs < 1:
        raise BadInput("--jobs", "must be at least 1")
    renderers = _renderers(args)
    files = et_files(args.traces)
    outputs = [(flag, getattr(args, key)) for flag, key in OUTPUT_OPTIONS]
    check_outputs([(flag, path) for flag, path in [*outputs, ("--write-network", args.write_network)]
                   if path is not None], files)
    edits = [parse_edit(action, text) for action, text in args.edits]  # bad syntax fails before loading
    if edits and args.model == "astra-sim":
        raise BadInput("simulate", "what-if edits (--scale, --set-duration, --comm-bandwidth) apply to the default "
                                   "model only; --model astra-sim replays the files as written")
    paths = {key: getattr(args, key) for _, key in OUTPUT_OPTIONS}
    return Options(files, edits, {key: (paths[key], renderers[key]) for key in WRITE_ORDER if paths[key] is not None})


def _check_model_options(args: argparse.Namespace) -> None:
    """Options that only one model reads, given to the other: a usage error, not silently ignored."""
    if args.model != "astra-sim":
        for flag, attr in simulate_astra.OPTIONS:
            if getattr(args, attr) is not None and getattr(args, attr) is not False:  # --npus 0 is given
                raise BadInput(flag, "only read with --model astra-sim")
        return
    for flag, attr in OUTPUT_OPTIONS:
        if getattr(args, attr) is not None:
            raise BadInput(flag, "not available with --model astra-sim")
    simulate_astra.check_arguments(args)


def _renderers(args: argparse.Namespace) -> dict[str, ReplayRenderer]:
    """Summary key -> the renderer of that output, with the plot's choices (checked here: before the replay)."""
    ranks: frozenset[int] | None = None
    window: Window | None = None
    if args.plot is not None or args.breakdown is not None:
        from etweave.simulate.plot import parse_ranks, parse_window, require_matplotlib

        require_matplotlib(args.plot if args.plot is not None else args.breakdown)  # fail before a long replay
        ranks = frozenset(parse_ranks(args.plot_ranks)) if args.plot_ranks is not None else None
        window = parse_window(args.plot_window) if args.plot_window is not None else None
    elif args.plot_ranks or args.plot_window:
        raise BadInput("--plot-ranks", "--plot-ranks and --plot-window choose what --plot/--breakdown draw: give one")
    return {"timeline": replay_renderer("timeline"), "plot": replay_renderer("plot", ranks=ranks, window=window),
            "breakdown": replay_renderer("breakdown", ranks=ranks), "csv": replay_renderer("csv", table="nodes"),
            "steps_csv": replay_renderer("csv", table="steps")}


def _summary(result: Replay, ranks: list[RankGraph], files: list[Path], unadjusted: str | None) -> dict[str, Any]:
    summary = summarize(result)
    origin, span = summary["origin_us"], summary["measured_span_us"]
    summary["step_times"] = step_times_in(result, (origin, origin + span) if summary["measured"] else None)
    summary["notes"] += coverage.missing_members(ranks, coverage.run_ranks(files))
    summary["warnings"] = [unadjusted] if unadjusted else []
    return summary


def _run_astra(args: argparse.Namespace, files: list[Path], groups: dict[str, list[int]]) -> int:
    astra = simulate_astra.run_astra(args, files, groups, _print_json)
    if args.json:
        _print_json(astra)
    else:
        print(simulate_astra.format_astra(astra))
    return 0


def _print_json(obj: dict[str, Any]) -> None:
    _print(summary_renderer("json").render(obj))


def _print(data: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
