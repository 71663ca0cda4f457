"""What ASTRA-sim would compute on etweave's output, per real trace: `python -m bench.astra`.

For every shared pair (one rank, replayed as 2 NPUs as FORMATS.md 3b did for resnet), the whole 2-rank gloo runs,
the bundled example and dlrm-8rank's run (`convert-run`): convert with this tree, then replay with
`simulate --model astra-sim` and print, against the measured span, the makespan with network-timed collectives
(the default ring, 50 GB/s, 500 ns), with collectives timed from the trace's durations, and with unlimited slots.
Where the single-slot run loses time: `cpu ovl` is how long two or more CPU nodes of a rank really ran at once
(measured, largest rank), `gpu ovl` the same for GPU streams; `held while another waited` names the kinds of
node that held a slot while another waited for it (summed over NPUs, top 3, µs); `no-slot delays` is the
network run again with `[idle]`/`[gpu idle]` delay nodes taking no slot (what that part of item 5 would buy).
Issue 12 item 5 asks for the first ratio to be within 5% of 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.run import traces_dir
from etweave.chakra.io import write_et
from etweave.commands.example_cmd import example_dir
from etweave.convert import run_pipeline
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.run import convert_run
from etweave.simulate.astra import SLOT_NAMES, AstraRank, load_for_astra, measured_span_us, simulate
from etweave.simulate.load import find_comm_group, load_comm_group

PAIRS = ["gpu/simple-add", "gpu/linear", "gpu/resnet", *[f"gpu/dlrm-8rank/rank{r}" for r in range(8)],
         "cpu-gloo/single_cnn/rank0", "cpu-gloo/orphan_wiki_single/rank0", "cpu-gloo/dist_ddp_w2/rank0",
         "cpu-gloo/dist_ddp_w2/rank1", "cpu-gloo/dist_fsdp1_w2/rank0", "cpu-gloo/dist_fsdp1_w2/rank1"]
RUNS = ["gpu/dlrm-8rank", "cpu-gloo/dist_ddp_w2", "cpu-gloo/dist_fsdp1_w2"]


def overlap_us(intervals: list[tuple[int, int]]) -> int:
    """Time during which two or more of the intervals were open at once."""
    edges = sorted([(s, 1) for s, e in intervals if e > s] + [(e, -1) for s, e in intervals if e > s])
    open_now, last, total = 0, 0, 0
    for t, step in edges:
        if open_now >= 2:
            total += t - last
        open_now += step
        last = t
    return total


def measured_overlap(rank: AstraRank) -> tuple[int, int]:
    """(CPU, GPU) µs during which the rank really ran two or more nodes of that class at once."""
    cpu = [(n.measured_start, n.measured_end) for n in rank.nodes if n.measured_start and n.is_cpu_op]
    gpu = [(n.measured_start, n.measured_end) for n in rank.nodes
           if n.measured_start and not n.is_cpu_op and n.type == 4]  # COMP_NODE on a GPU stream
    return overlap_us(cpu), overlap_us(gpu)


def row(name: str, files: list[Path], groups: dict[str, list[int]]) -> str:
    ranks = load_for_astra(files)
    span = measured_span_us(ranks) or 0
    net = simulate(ranks, groups)
    dur = simulate(ranks, groups, collectives="duration")
    free = simulate(ranks, groups, slots=False)
    no_delay = simulate(ranks, groups, slotless_kinds=("delay",))
    held: Counter[str] = Counter()
    for blocked in net.blocked_by:
        for (slot, kind), ns in blocked.items():
            held[f"{SLOT_NAMES[slot]}:{kind}"] += ns // 1000
    held_text = ", ".join(f"{k} {v}" for k, v in held.most_common(3) if v)
    cpu_ovl, gpu_ovl = (max(v) for v in zip(*(measured_overlap(r) for r in ranks), strict=True))

    def ratio(run_ns: int) -> str:
        return f"{run_ns / 1000 / span:7.3f}x" if span else "      -"

    stuck = "" if not net.stuck_count else f"  STUCK {net.stuck_count}"
    return (f"{name:36s} {len(ranks):4d} {span:9d} {ratio(net.makespan_ns)} {ratio(dur.makespan_ns)} "
            f"{ratio(free.makespan_ns)} {ratio(no_delay.makespan_ns)} {cpu_ovl:8d} {gpu_ovl:8d}  {held_text}{stuck}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="rows whose name contains one of these (comma-separated)")
    args = ap.parse_args(argv)
    wanted = args.only.split(",") if args.only else None
    root = traces_dir()
    print(f"{'trace':36s} {'npus':>4s} {'span us':>9s} {'network':>8s} {'durations':>8s} {'no slots':>8s} "
          f"{'no-slot delays':>8s} {'cpu ovl':>8s} {'gpu ovl':>8s}  held while another waited (us, all NPUs)")
    with tempfile.TemporaryDirectory(prefix="etweave-astra-") as tmp:
        for rel in PAIRS:
            if wanted and not any(w in rel for w in wanted):
                continue
            d = root / rel
            result = run_pipeline(read_host_et(d / "host.json.gz"), read_kineto(d / "kineto.json.gz"))
            path = Path(tmp) / rel.replace("/", "_") / "trace.0.et"
            path.parent.mkdir()
            write_et(path, result.metadata, result.nodes)
            print(row(rel, [path], {}), flush=True)
        for rel, src in [(f"{r} (run)", root / r) for r in RUNS] + [("bundled example (run)", example_dir())]:
            if wanted and not any(w in rel for w in wanted):
                continue
            out = Path(tmp) / rel.replace("/", "_").replace(" ", "_")
            convert_run(src, out, jobs=1)
            files = sorted(out.glob("*.et"))
            cg = find_comm_group(files)
            print(row(rel, files, load_comm_group(cg) if cg else {}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
