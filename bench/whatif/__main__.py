"""What-if predictions against real changed runs: `python -m bench.whatif [--repeats N] [--quick] [--runs DIR]`.

For every pair of `bench/whatif/workload.py` (run A, and run B that differs in one op), recorded with
`etweave.collect` on 2 CPU ranks with gloo: convert both with `convert-run`, predict B from A's files plus the
pair's what-if edits only (`etweave.simulate.whatif`), and compare with B as measured. README.md explains the
columns and the pass rule.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.whatif.workload import PAIRS, POLICY_FILE, run_dir
from etweave.run import convert_run
from etweave.simulate.engine import RankGraph, replay
from etweave.simulate.load import find_comm_group, load_comm_group, load_rank
from etweave.simulate.steps import step_bounds, step_times
from etweave.simulate.whatif import apply, parse_edit, select

REPO = Path(__file__).resolve().parents[2]
MAX_ERR_OF_B = 5.0  # % of B's span (issue 17, "Done when")
MAX_ERR_OF_EFFECT = 25.0  # % of the measured effect B - A
STABLE_B = 3.0  # a pair counts when B varies by less than this (% of its median span) across repeats
MIN_EFFECT = 15.0  # a pair that is not a control must move B's span by at least this (% of A)


@dataclass
class Repeat:
    a_us: int  # A's measured span over its recorded steps
    b_us: int  # B's measured span
    predicted_us: int  # the replay of A's graph with the edits
    replay_a_us: int  # the replay of A's graph unedited (how well the model replays A itself)
    naive_us: int  # A's span + the time the edits added (naive_added)
    steps: list[tuple[int | None, int | None, int]]  # per step: (step, B measured, predicted)
    delay_share: float | None = None  # % (delay_share_function), the largest over A's ranks
    edits: list[str] = field(default_factory=list)  # as `etweave simulate` options
    edited_us: int = 0  # the edited nodes' durations in A's graph after the edits
    b_op_us: int = 0  # the same selection's durations in B's graph, as measured: does the edit say what B did?


@dataclass
class PairResult:
    name: str
    control: bool
    repeats: list[Repeat] = field(default_factory=list)


def _load(out: Path) -> tuple[list[RankGraph], dict[str, list[int]]]:
    files = sorted(out.glob("*.et"))
    group_file = find_comm_group(files)
    return [load_rank(f) for f in files], (load_comm_group(group_file) if group_file else {})


def _span(times: dict[str, Any], key: str) -> int:
    value = times["span"][key]
    assert value is not None, "no measured span"
    return int(value)


def delay_share_function() -> Callable[[Sequence[Any]], float] | None:
    """The hook for issue 17's delay share (the share of the critical path, unlimited resources, in nodes that
    stand for no measured op), as a function of a rank's Chakra nodes (`pb.Node`) returning a percentage. It is
    looked up, not imported, so that this benchmark runs before and after `etweave.fidelity.delay_share` exists;
    that function takes `path_nodes(nodes)` and returns an object with `share` (%), or a fraction."""
    fidelity = importlib.import_module("etweave.fidelity")
    fn = getattr(fidelity, "delay_share", None)
    if not callable(fn):
        return None
    convert = getattr(fidelity, "path_nodes", None)

    def percent(nodes: Sequence[Any]) -> float:
        out = fn(convert(nodes) if callable(convert) else nodes)
        return float(out.share) if hasattr(out, "share") else 100.0 * float(out)

    return percent


def _run_delay_share(out: Path, fn: Callable[[Sequence[Any]], float]) -> float:
    from etweave.chakra.io import read_et

    return max(fn(read_et(f)[1]) for f in sorted(out.glob("*.et")))


def naive_added(ranks: list[RankGraph], before: list[list[int]]) -> int:
    """The µs the edits added, as the naive estimate counts them: each step longer by the most that the edits added
    to any one rank in that step (ranks run side by side; steps one after the other). Nodes outside the recorded
    steps count as one more step."""
    total = 0
    per_step: dict[int | None, dict[int, int]] = {}
    for ri, rg in enumerate(ranks):
        bounds = step_bounds(rg.nodes)
        for i, nd in enumerate(rg.nodes):
            change = nd.duration - before[ri][i]
            if change:
                step = next((k for k, (lo, hi) in bounds.items() if lo <= nd.measured_start < hi), None)
                by_rank = per_step.setdefault(step, {})
                by_rank[ri] = by_rank.get(ri, 0) + change
    for by_rank in per_step.values():
        total += max(by_rank.values(), key=abs)
    return total


def measure_repeat(name: str, runs: Path, converted: Path, k: int, stretch: float) -> Repeat:
    pair = PAIRS[name]
    outs = {}
    for side in ("A", "B"):
        outs[side] = converted / name / side / f"r{k}"
        if not any(outs[side].glob("*.et")):
            convert_run(run_dir(runs, name, side, k), outs[side], jobs=1)
    ranks_a, groups = _load(outs["A"])
    ranks_b, groups_b = _load(outs["B"])
    base = replay(ranks_a, groups)
    times_a = step_times(base)
    measured_b = step_times(replay(ranks_b, groups_b))
    steps = sorted({s["step"] for s in times_a["steps"]})
    edits = [parse_edit(action, text) for action, text in pair.edits(steps, stretch)]
    before = [[nd.duration for nd in rg.nodes] for rg in ranks_a]
    applied = apply(ranks_a, edits)
    added = naive_added(ranks_a, before)
    # the same nodes in B (same names, ranks, steps), with the durations B's conversion gave them
    b_op = sum(rg.nodes[i].duration for e in edits for rg in ranks_b for group in select(rg, e.selector)
               for i in group)
    predicted = step_times(replay(ranks_a, groups))
    b_by_step = {s["step"]: s["measured_us"] for s in measured_b["steps"]}
    fn = delay_share_function()
    return Repeat(
        a_us=_span(times_a, "measured_us"),
        b_us=_span(measured_b, "measured_us"),
        predicted_us=_span(predicted, "simulated_us"),
        replay_a_us=_span(times_a, "simulated_us"),
        naive_us=_span(times_a, "measured_us") + added,
        steps=[(s["step"], b_by_step.get(s["step"]), s["simulated_us"]) for s in predicted["steps"]],
        delay_share=_run_delay_share(outs["A"], fn) if fn is not None else None,
        edits=[e.label for e in edits],
        edited_us=sum(r.after_us for r in applied),
        b_op_us=b_op,
    )


def record(runs: Path, pairs: Sequence[str], repeats: int, steps: int, stretch: float) -> None:
    log = runs / "record.log"
    runs.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "bench.whatif.workload", str(runs), "--repeats", str(repeats),
                               "--steps", str(steps), "--pairs", ",".join(pairs), "--stretch", str(stretch)],
                              cwd=REPO, stdout=fh, stderr=fh)
    if proc.returncode != 0:
        sys.exit(f"recording failed (exit {proc.returncode}); see {log}:\n" + log.read_text()[-3000:])


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else float("nan")


@dataclass
class Verdict:
    b_median: float
    b_variation: float  # (max - min) / median of B's span across repeats, %
    b_spread: float  # 1.4826 x median absolute deviation / median of B's span, % (a robust standard deviation)
    effect: float  # median of B - A
    predicted_effect: float  # median of predicted - A
    err_of_b: float  # median |predicted - B| / B, %
    err_of_effect: float  # median |predicted - B| / |B - A|, %
    naive_err_of_b: float
    direction: str  # "ok" when predicted and measured lie on the same side of the naive estimate, "=" when B is it
    passed: bool
    stable: bool  # b_spread < STABLE_B
    small_effect: bool  # not a control, and |B - A| < MIN_EFFECT % of A


def verdict(res: PairResult) -> Verdict:
    reps = res.repeats
    b = [r.b_us for r in reps]
    med_b = statistics.median(b)
    variation = _pct(max(b) - min(b), med_b)
    spread = _pct(1.4826 * statistics.median(abs(x - med_b) for x in b), med_b)
    effect = statistics.median(r.b_us - r.a_us for r in reps)
    err_b = statistics.median(_pct(abs(r.predicted_us - r.b_us), r.b_us) for r in reps)
    err_eff = statistics.median(_pct(abs(r.predicted_us - r.b_us), abs(r.b_us - r.a_us)) for r in reps)
    naive = statistics.median(_pct(abs(r.naive_us - r.b_us), r.b_us) for r in reps)
    pred_eff = statistics.median(r.predicted_us - r.a_us for r in reps)
    side_measured = statistics.median(r.b_us - r.naive_us for r in reps)
    side_predicted = statistics.median(r.predicted_us - r.naive_us for r in reps)
    # Where B lies within the error bound of the naive estimate, the naive estimate is right (a straggler on the
    # critical path adds exactly its time): there is no direction to get right or wrong ("=").
    if abs(side_measured) <= MAX_ERR_OF_B / 100 * med_b:
        direction = "="
    else:
        direction = "ok" if (side_measured > 0) == (side_predicted > 0) else "WRONG"
    if res.control:
        # a control predicts no change: the predicted span stays within the bound of A's
        no_change = statistics.median(_pct(abs(r.predicted_us - r.a_us), r.b_us) for r in reps)
        passed = no_change <= MAX_ERR_OF_B and err_b <= MAX_ERR_OF_B
    else:
        passed = err_b <= MAX_ERR_OF_B and err_eff <= MAX_ERR_OF_EFFECT and direction != "WRONG"
    small = not res.control and abs(effect) < MIN_EFFECT / 100 * statistics.median(r.a_us for r in reps)
    return Verdict(med_b, variation, spread, effect, pred_eff, err_b, err_eff, naive, direction, passed,
                   spread < STABLE_B, small)


def report(results: list[PairResult], per_step: bool) -> list[str]:
    lines = [f"{'pair':22s} {'A us':>8s} {'B us':>8s} {'B var%':>6s} {'B sd%':>6s} {'effect':>8s} {'pred us':>8s} "
             f"{'err%B':>6s} {'err%eff':>7s} {'naive us':>8s} {'naive%B':>7s} {'dir':>5s} {'replayA%':>8s} "
             f"{'edit%':>6s} {'delay%':>6s}  verdict"]
    for res in results:
        v = verdict(res)
        reps = res.repeats
        a = statistics.median(r.a_us for r in reps)
        pred = statistics.median(r.predicted_us for r in reps)
        naive = statistics.median(r.naive_us for r in reps)
        replay_a = statistics.median(_pct(r.replay_a_us - r.a_us, r.a_us) for r in reps)
        shares = [r.delay_share for r in reps if r.delay_share is not None]
        share = f"{statistics.median(shares):6.1f}" if shares else f"{'-':>6s}"
        status = ("pass" if v.passed else "FAIL") + ("" if v.stable else " (B unstable)") + \
            (" (effect < 15%)" if v.small_effect else "")
        edit = statistics.median(_pct(r.b_op_us - r.edited_us, r.edited_us) for r in reps)
        name = res.name + (" (ctl)" if res.control else "")
        lines.append(f"{name:22s} {a:8.0f} {v.b_median:8.0f} {v.b_variation:6.1f} {v.b_spread:6.1f} "
                     f"{v.effect:+8.0f} {pred:8.0f} {v.err_of_b:6.1f} {v.err_of_effect:7.0f} {naive:8.0f} "
                     f"{v.naive_err_of_b:7.1f} {v.direction:>5s} {replay_a:+8.2f} {edit:+6.1f} {share}  {status}")
        if per_step:
            by_step: dict[int | None, list[tuple[int | None, int]]] = {}
            for r in reps:
                for step, measured, predicted in r.steps:
                    by_step.setdefault(step, []).append((measured, predicted))
            for step, values in sorted(by_step.items(), key=lambda kv: kv[0] or 0):
                ms = [m for m, _ in values if m is not None]
                ps = [p for _, p in values]
                m_med = statistics.median(ms) if ms else float("nan")
                p_med = statistics.median(ps)
                lines.append(f"    ProfilerStep#{step}: B measured {m_med:8.0f} us, predicted {p_med:8.0f} us "
                             f"({_pct(p_med - m_med, m_med):+.1f}%)")
    return lines


def shared_delay_shares(fn: Callable[[Sequence[Any]], float]) -> list[str]:
    """The delay share of every pair of the shared traces (gpu/ and cpu-gloo/), one rank at a time."""
    from bench.scale import traces_dir
    from etweave.convert import run_pipeline
    from etweave.read.host_et import read_host_et
    from etweave.read.kineto import read_kineto

    root = traces_dir()
    hosts = sorted([*root.glob("gpu/**/host.json.gz"), *root.glob("cpu-gloo/**/host.json.gz")])
    if not hosts:
        return [f"delay share of the shared traces: none found under {root} (set ETWEAVE_TRACES)"]
    lines = ["delay share of the critical path (unlimited resources), shared traces:"]
    for host in hosts:
        d = host.parent
        result = run_pipeline(read_host_et(host), read_kineto(d / "kineto.json.gz"))
        lines.append(f"  {d.relative_to(root)!s:38s} {fn(result.nodes):6.1f}%")
    return lines


def load_average() -> str:
    """The machine's load average now: how busy it was while the pairs were recorded."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min) on {os.cpu_count()} cores"


def recorded_policy(runs: Path) -> str:
    policy = runs / POLICY_FILE
    if not policy.exists():
        return "recorded steps: scheduling policy not recorded (an older recording)"
    realtime = json.loads(policy.read_text()).get("realtime")
    return ("recorded steps ran under SCHED_FIFO (no other process preempted them)" if realtime else
            "recorded steps ran at the ordinary scheduling policy (SCHED_FIFO not permitted): B varies more on a "
            "busy machine")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="A/B recordings per pair (default 5, at least 3)")
    ap.add_argument("--steps", type=int, default=8, help="recorded steps per run (default 8)")
    ap.add_argument("--stretch", type=float, default=2.0,
                    help="time stretch of every pair: sleeps, async all_reduce size, bmm batch (default 2)")
    ap.add_argument("--quick", action="store_true", help="3 repeats of 2 steps, stretch 1, no shared traces")
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated subset of {', '.join(PAIRS)}")
    ap.add_argument("--runs", type=Path, help="keep the recordings (and conversions) here; reuse them if present")
    ap.add_argument("--per-step", action="store_true", help="also print each step's predicted vs measured time")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.stretch = 3, 2, 1.0
    if args.repeats < 3:
        ap.error("--repeats: at least 3 (medians)")
    pairs = args.pairs.split(",")
    unknown = sorted(set(pairs) - set(PAIRS))
    if unknown:
        ap.error(f"unknown pairs {unknown}")
    with tempfile.TemporaryDirectory(prefix="etweave-whatif-") as tmp:
        runs = args.runs or Path(tmp) / "runs"
        meta = runs / "settings.json"
        settings = {"steps": args.steps, "stretch": args.stretch}
        if meta.exists() and json.loads(meta.read_text()) != settings:
            ap.error(f"{runs} was recorded with {meta.read_text()}, not {settings}: choose another --runs")
        if not all(run_dir(runs, p, s, k).is_dir() for p in pairs for s in "AB" for k in range(args.repeats)):
            print(f"recording {len(pairs)} pairs x {args.repeats} repeats x {args.steps} steps, stretch "
                  f"{args.stretch:g} (2 gloo ranks) in {runs}; {load_average()}", flush=True)
            record(runs, pairs, args.repeats, args.steps, args.stretch)
            meta.write_text(json.dumps(settings))
            print(f"recorded; {load_average()}")
        print(recorded_policy(runs))
        converted = runs / "converted"
        results = []
        for name in pairs:
            res = PairResult(name, PAIRS[name].control)
            res.repeats = [measure_repeat(name, runs, converted, k, args.stretch) for k in range(args.repeats)]
            results.append(res)
        print(f"pairs (times at stretch 1; this run: x{args.stretch:g}):")
        for res in results:
            print(f"{res.name}: {PAIRS[res.name].what}\n    edits: {' '.join(res.repeats[0].edits)}")
        print("\n".join(report(results, args.per_step or not args.quick)))
        fn = delay_share_function()
        if fn is None:
            print("delay share: no delay_share function yet (issue 17 items 1-3; see delay_share_function)")
        elif not args.quick:
            print("\n".join(shared_delay_shares(fn)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
