"""`etweave simulate --model astra-sim`: run the ASTRA-sim model twice (network-timed collectives, then the
trace's durations) and report both beside the measured span, with ASTRA-sim's `sys[R] finished` lines."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etweave.cpus import default_jobs
from etweave.errors import BadInput, CheckFailed
from etweave.progress import stage
from etweave.read.widths import MAX_RANKS
from etweave.simulate.astra import SLOT_NAMES, AstraRun, load_for_astra, measured_span_us, simulate_timings
from etweave.simulate.engine import GraphError
from etweave.simulate.netfit import fit_network, write_network_yml
from etweave.simulate.network import DEFAULT_NETWORK, load_network

# --network values that fit the network to the run instead of reading a file
FITTED = ("fitted", "fitted-robust", "fitted-per-type")

HELP = """\
--model astra-sim: ASTRA-sim's rules (docs/FACTS.md §A). Per NPU one CPU slot (every is_cpu_op node, all threads),
one GPU-compute slot (every other COMP node, all streams), one comm slot (collectives, sends; recvs take none);
whenever a node finishes, the ready nodes issue in ascending id where their slot is free. Time in ns:
duration_micros x 1000, 0 -> 1 ns; start_time_micros is not read; METADATA_NODE reads as COMP_NODE.
ALL_REDUCE/ALL_GATHER/REDUCE_SCATTER/ALL_TO_ALL start when every member issued them and are timed from
comm_size by the analytical network (--network, default Ring 50 GB/s 500 ns: 4 chunks one after another, each
ring step hops x latency + bytes / bandwidth + 10 ns; no congestion, no memory-bus time); BROADCAST lasts its
duration_micros with no cross-rank sync. A second run times collectives from duration_micros: the graph on the
measured network (within 5% of the measured span on the shared traces; the first run is another network). Prints
`sys[R] finished, T cycles` (ns) per NPU, as ASTRA-sim does. One trace is replayed as --npus NPUs (default 2).
--network fitted: the ring's latency and bandwidth fitted by least squares to the run's measured transfer times
(every network-timed collective and send: transfer_duration_micros after convert-run, else duration_micros), so
the network run asks whether the graph reproduces the run under ASTRA-sim's rules; fitted-robust: a Huber fit
that the few slow collectives (gloo's first all-reduce: connection set-up) do not pull; fitted-per-type: a
least-squares pair per collective type and for sends (etweave's model only: ASTRA-sim's config has one pair,
so --write-network refuses it). Each prints the fitted parameters, the residuals per collective type and every
outlier (residual over 3 robust scales) with its error. Measured: the least-squares fit puts the bundled example
and the gloo and dlrm runs within 5%, not single dlrm ranks (README "A network fitted to the measured run").
--write-network FILE.yml writes the network used as ASTRA-sim's config (npus_count = the NPUs replayed)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=("default", "astra-sim"), default="default",
                   help="default: a slot per CPU thread and per GPU stream (the rules below); astra-sim: what "
                        "ASTRA-sim computes (see the end of this help)")
    p.add_argument("--network", metavar="FILE.yml|fitted|fitted-robust|fitted-per-type",
                   help="astra-sim: an ASTRA-sim analytical network config (1-D Ring or Switch; e.g. "
                        "../shared/astra-sim/configs/switch_8npus.yml), or a ring fitted to the run's measured "
                        "transfer times (see the end of this help; a file named so: ./fitted); default Ring, "
                        "50 GB/s, 500 ns")
    p.add_argument("--write-network", type=Path, metavar="FILE.yml",
                   help="astra-sim: write the network used (e.g. the fitted one) as an ASTRA-sim network config")
    p.add_argument("--unlimited-slots", action="store_true",
                   help="astra-sim: no CPU/GPU/comm slots (every ready node issues at once), to see what they cost")
    p.add_argument("--npus", type=int, metavar="N",
                   help="astra-sim: replay a single trace as N NPUs (default 2; ASTRA-sim refuses 1; at most 2^20)")


# options only this model reads: (option, attribute of the parsed arguments); etweave.commands.simulate_cmd
# refuses them with the default model
OPTIONS = (("--network", "network"), ("--unlimited-slots", "unlimited_slots"), ("--npus", "npus"),
           ("--write-network", "write_network"))


def check_arguments(args: argparse.Namespace) -> None:
    """This model's own rules for its options (simulate_cmd.check_options calls it, with every other check)."""
    if args.write_network is not None and args.network == "fitted-per-type":
        raise BadInput("--write-network", "ASTRA-sim's network file holds one latency/bandwidth pair: "
                                          "not available with --network fitted-per-type")
    if args.npus is not None and args.npus < 2:
        raise BadInput("--npus", "ASTRA-sim's analytical network refuses fewer than 2 NPUs")
    if args.npus is not None and args.npus > MAX_RANKS:
        raise BadInput("--npus", f"{args.npus} NPUs: at most {MAX_RANKS}, the largest world size etweave reads")


def _run_summary(run: AstraRun, span_us: int | None) -> dict[str, Any]:
    makespan_us = run.makespan_ns / 1000
    return {
        "collectives": run.collectives,
        "finished_ns": {str(rg.rank): f for rg, f in zip(run.ranks, run.finished_ns, strict=True)},
        "makespan_ns": run.makespan_ns,
        "ratio_to_measured": round(makespan_us / span_us, 4) if span_us else None,
        "slot_wait_us_max": {name: max(w[i] for w in run.slot_wait_ns) // 1000 for i, name in enumerate(SLOT_NAMES)}
        if run.slots else None,
        "stuck_nodes": run.stuck_count,
        "stuck": run.stuck,
        "notes": run.notes,
    }


def run_astra(args: argparse.Namespace, files: list[Path], groups: dict[str, list[int]],
              print_json: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Both runs, as one JSON-able dict; raises CheckFailed when the network run leaves NPUs unfinished."""
    ranks = load_for_astra(files, args.npus, args.jobs or default_jobs())
    fit = None
    if args.network in FITTED:
        fit = fit_network(ranks, groups, robust=args.network == "fitted-robust",
                          per_type=args.network == "fitted-per-type", source=args.network)
        network = fit.network
    else:
        network = load_network(Path(args.network)) if args.network is not None else DEFAULT_NETWORK
    slots = not args.unlimited_slots
    try:
        with stage("replaying (ASTRA-sim model)"):
            runs = simulate_timings(ranks, groups, network, ("network", "duration"), slots, contention=False)
    except GraphError as exc:
        where = ranks[exc.rank_index].source if exc.rank_index is not None else ", ".join(map(str, files))
        raise BadInput(where, exc.problem) from exc
    span = measured_span_us(ranks)
    if network.npus_count is not None and network.npus_count != len(ranks):
        for run in runs:  # the formula does not need it, but ASTRA-sim would not run this pair
            run.notes.append(f"{network.source} says npus_count {network.npus_count}; {len(ranks)} NPUs replayed")
    summary: dict[str, Any] = {  # what --json prints
        "model": "astra-sim",
        "npus": [rg.rank for rg in ranks],
        "files": sorted({rg.source for rg in ranks}),
        "network": network.describe(),
        "slots": "one CPU, one GPU-compute, one comm slot per NPU" if slots else "unlimited",
        "measured_span_us": span,
        "runs": {run.collectives: _run_summary(run, span) for run in runs},
    }
    if fit is not None:
        summary["network_fit"] = fit.summary()
    if runs[0].stuck_count:
        if args.json:  # the stuck nodes are in the object too, as with the default model
            print_json(summary)
        raise CheckFailed("\n".join([*finished_lines(runs[0]),
                                     f"astra-sim model: {runs[0].stuck_count} nodes never finish; first ones:",
                                     *(f"  {s}" for s in runs[0].stuck)]))
    if args.write_network is not None:  # only for a run that finished: a failed one leaves no file
        write_network_yml(args.write_network, network, len(ranks), fit)
    return summary


def finished_lines(run: AstraRun) -> list[str]:
    """ASTRA-sim's own end-of-run line per NPU (an NPU that never finishes prints none)."""
    return [f"sys[{rg.rank}] finished, {f} cycles" for rg, f in zip(run.ranks, run.finished_ns, strict=True)
            if f is not None]


def format_astra(summary: dict[str, Any]) -> str:
    s = summary
    net, dur = s["runs"]["network"], s["runs"]["duration"]
    files = s["files"][0] if len(s["files"]) == 1 else f"{len(s['files'])} files"
    lines = [f"model astra-sim: {len(s['npus'])} NPUs from {files}; network {s['network']}; slots: {s['slots']}"]
    lines += [f"sys[{r}] finished, {f} cycles" for r, f in net["finished_ns"].items() if f is not None]
    span = s["measured_span_us"]

    def one(run: dict[str, Any]) -> str:
        text = f"{run['makespan_ns'] / 1000:.0f} us"
        return text + (f" = {run['ratio_to_measured']:.3f}x the measured span" if span else "")

    lines.append(f"makespan: {one(net)}" + (f" ({span} us)" if span else " (no measured times to compare with)")
                 + f"; with collectives timed from the trace's durations: {one(dur)}")
    if net["slot_wait_us_max"] is not None:
        waits = ", ".join(f"{k} {v} us" for k, v in net["slot_wait_us_max"].items())
        lines.append(f"slot waits (ready to issue), largest NPU: {waits}")
    if "network_fit" in s:
        lines += fit_lines(s["network_fit"])
    notes = dict.fromkeys(net["notes"] + dur["notes"])
    lines += [f"note: {n}" for n in notes]
    if dur["stuck_nodes"]:
        lines.append(f"note: with the trace durations, {dur['stuck_nodes']} nodes never finish")
    return "\n".join(lines)


def fit_lines(fit: dict[str, Any]) -> list[str]:
    """The fitted parameters, the residuals per collective type and the outliers with their error."""
    pair = ("a pair per type" if fit["per_type"]
            else f"{fit['bandwidth_gbps']:.6g} GB/s, {fit['latency_ns']:.6g} ns per hop")
    lines = [f"fitted to {fit['samples']} measured transfer times: {pair}; residual robust scale "
             f"{fit['robust_scale_us']} us"]
    for comm, t in fit["by_type"].items():
        own = fit["per_type"].get(comm)
        pair = f" ({own['bandwidth_gbps']:.6g} GB/s, {own['latency_ns']:.6g} ns)" if own else ""
        lines.append(f"  {comm}{pair}: {t['samples']} measured {t['measured_us']} us in all, "
                     f"fitted {t['fitted_us']} us; "
                     f"residual rms {t['rms_residual_us']} us, largest {t['max_abs_residual_us']} us")
    for o in fit["outliers"]:
        lines.append(f"  outlier: rank {o['rank']} node {o['node']} {o['name']} ({o['comm']}, {o['comm_size']} B): "
                     f"measured {o['measured_us']} us, fitted {o['fitted_us']} us")
    lines += [f"note: {n}" for n in fit["notes"]]
    return lines
