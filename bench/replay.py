"""Replay speed and fidelity, in one run: `python -m bench.replay`.

For each real pair and for dlrm-8rank as a whole run: convert it, then report the replay's nodes per second
(`etweave simulate`'s engine alone, best of 3, the .et already loaded), and the fidelity figures of the
dependency model (critical path with unlimited resources against the measured span, GPU op start errors), and the
delay share of the critical path (`etweave.fidelity.delay_share`, as the report shows it: nodes that stand for no
measured op). Then, for dlrm-8rank: how much halving every GPU duration shrinks each rank, converted alone (critical
path) and by convert-run (all 8 ranks replayed together by the engine), against the share of its span it spent
blocked in GPU syncs (in all, and while the GPU ran)."""

from __future__ import annotations

import gzip
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench.run import traces_dir
from etweave.chakra.io import write_et
from etweave.convert import run_pipeline
from etweave.fidelity import blocked_in_gpu_syncs, critical_path, delay_share, measure, path_nodes
from etweave.model import GPU_KINDS
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.run import convert_run
from etweave.runfolder import metadata_rank
from etweave.simulate.engine import RankGraph, replay
from etweave.simulate.load import find_comm_group, load_comm_group, load_rank

PAIRS = ["gpu/simple-add", "gpu/linear", "gpu/resnet", *[f"gpu/dlrm-8rank/rank{r}" for r in range(8)],
         "cpu-gloo/single_cnn/rank0", "cpu-gloo/orphan_wiki_single/rank0", "cpu-gloo/dist_ddp_w2/rank0",
         "cpu-gloo/dist_ddp_w2/rank1", "cpu-gloo/dist_fsdp1_w2/rank0", "cpu-gloo/dist_fsdp1_w2/rank1"]


def _replay_rate(ranks: list[RankGraph], groups: dict[str, list[int]]) -> float:
    nodes = sum(len(r.nodes) for r in ranks)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        replay(ranks, groups)
        best = min(best, time.perf_counter() - t)
    return nodes / best


def main() -> int:
    root = traces_dir()
    print(f"{'trace':38s} {'nodes':>7s} {'span us':>9s} {'crit.path':>9s} {'delay%':>7s} {'gpu p50%':>8s} "
          f"{'gpu p95%':>8s} {'gpu max%':>8s} {'coll max%':>9s} {'replay nodes/s':>14s}")
    halving: list[str] = []
    with tempfile.TemporaryDirectory(prefix="etweave-replay-") as tmp:
        for rel in PAIRS:
            d = root / rel
            result = run_pipeline(read_host_et(d / "host.json.gz"), read_kineto(d / "kineto.json.gz"))
            f = measure(result.nodes)
            share = delay_share(path_nodes(result.nodes)).share
            path = Path(tmp) / f"trace.{metadata_rank(result.metadata, rel) or 0}.et"  # the name says the rank
            write_et(path, result.metadata, result.nodes)
            rate = _replay_rate([load_rank(path)], {})
            print(f"{rel:38s} {len(result.nodes):7d} {f.span:9.0f} {f.critical_path_error:+8.2f}% {share:6.1f}% "
                  f"{f.start_error_p50:8.2f} {f.start_error_p95:8.2f} {f.start_error_max:8.2f} "
                  f"{f.collective_error_max:9.2f} {rate:14,.0f}")
            if "dlrm" in rel:
                halving.append(_halved_alone(rel, result.nodes, result.graph, f.span))
        # the orphan case of the dependency issue: dlrm rank 0 without `## forward ##` and `## sparse_data_dist ##`
        src = root / "gpu/dlrm-8rank/rank0"
        doc = orjson.loads(gzip.decompress((src / "host.json.gz").read_bytes()))
        doc["nodes"] = [n for n in doc["nodes"] if n["name"] not in ("## forward ##", "## sparse_data_dist ##")]
        orphan_host = Path(tmp) / "orphans.json"
        orphan_host.write_bytes(orjson.dumps(doc))
        result = run_pipeline(read_host_et(orphan_host), read_kineto(src / "kineto.json.gz"))
        f = measure(result.nodes)
        share = delay_share(path_nodes(result.nodes)).share
        print(f"{'dlrm rank0, 2 parents deleted (orphans)':38s} {len(result.nodes):7d} {f.span:9.0f} "
              f"{f.critical_path_error:+8.2f}% {share:6.1f}% {f.start_error_p50:8.2f} {f.start_error_p95:8.2f} "
              f"{f.start_error_max:8.2f} {f.collective_error_max:9.2f}")
        out = Path(tmp) / "dlrm"
        convert_run(root / "gpu/dlrm-8rank", out, jobs=1)
        files = sorted(out.glob("*.et"))
        ranks = [load_rank(p) for p in files]
        cg = find_comm_group(files)
        rate = _replay_rate(ranks, load_comm_group(cg) if cg else {})
        print(f"{'gpu/dlrm-8rank (8 ranks together)':38s} {sum(len(r.nodes) for r in ranks):7d} "
              f"{'':9s} {'':9s} {'':7s} {'':8s} {'':8s} {'':8s} {'':9s} {rate:14,.0f}")
        together = _halved_together(ranks, load_comm_group(cg) if cg else {})
    print("\nhalving every GPU duration, gpu/dlrm-8rank: shrink of the critical path (alone) and of the rank's")
    print("replayed end (convert-run, 8 ranks together), against the share of the span blocked in GPU syncs: in all,")
    print("while the GPU ran, and of that while it ran a collective kernel (which also waits for the collective's")
    print("peers: converted alone, that wait is part of the kernel's duration; together, it is the peers' arrival)")
    print(f"{'rank':38s} {'alone':>8s} {'together':>9s} {'blocked':>8s} {'GPU running':>12s} {'collective':>11s}")
    for line, shrink in zip(halving, together, strict=True):
        name, rest = line.split("|")
        alone, blocked, busy, coll = rest.split()
        print(f"{name:38s} {alone:>8s} {shrink:8.2f}% {blocked:>8s} {busy:>12s} {coll:>11s}")
    return 0


def _halved_alone(rel: str, nodes: list, g: object, span: float) -> str:
    pn = path_nodes(nodes)
    cp, _ = critical_path(pn)
    halved, _ = critical_path(pn, {n.id: n.duration / 2 for n in pn if n.kind in GPU_KINDS})
    b = blocked_in_gpu_syncs(g)  # type: ignore[arg-type]
    return (f"{rel}|{100 * (cp - halved) / cp:.2f}% {100 * b.blocked / span:.1f}% {100 * b.while_busy / span:.1f}% "
            f"{100 * b.while_collective / span:.1f}%")


def _halved_together(ranks: list[RankGraph], groups: dict[str, list[int]]) -> list[float]:
    """Per rank: how much earlier its last node ends when every GPU node (collectives included) takes half as long."""
    base = replay(ranks, groups)
    for r in ranks:
        for n in r.nodes:
            if n.resource is not None and n.resource.startswith("gpu") and n.name != "[gpu idle]":
                n.duration //= 2
    half = replay(ranks, groups)
    return [100.0 * (max(b) - max(h)) / max(b) for b, h in zip(base.end, half.end, strict=True)]


if __name__ == "__main__":
    sys.exit(main())
