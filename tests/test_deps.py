"""Dependency inference: replaying the output reproduces the measured run, and waits are edges (what-if works)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import PAIRS, convert_pair, load_gz, write_gz

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs
from etweave.convert import Result, run_pipeline
from etweave.deps.evidence import Evidence
from etweave.fidelity import asap, measure
from etweave.model import WAKEUP, Edge
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto


def _orphan_dlrm(traces: Path, tmp_path: Path) -> Result:
    src = traces / "gpu/dlrm-8rank/rank0"
    doc = load_gz(src / "host.json.gz")
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] not in ("## forward ##", "## sparse_data_dist ##")]
    host = write_gz(tmp_path / "host.json.gz", doc)
    return run_pipeline(read_host_et(host), read_kineto(src / "kineto.json.gz"))


def _pair(e: Edge) -> tuple[int, int]:
    return e.src, e.dst


def _assert_faithful(result: Result) -> None:
    f = measure(result.nodes)
    assert abs(f.critical_path_error) <= 2.0, f"critical path {f.critical_path_error:+.2f}% off the measured span"
    assert f.start_error_p95 <= 2.0 and f.start_error_max <= 5.0, (f.start_error_p95, f.start_error_max)
    assert f.collective_error_max <= 5.0
    assert f.no_predecessor == [], "only the first op of each thread and stream lacks a predecessor"


@pytest.mark.parametrize("rel", PAIRS)
def test_replay_reproduces_measured_run(traces: Path, rel: str) -> None:
    _assert_faithful(convert_pair(traces, rel))


def test_replay_of_orphan_case(traces: Path, tmp_path: Path) -> None:
    _assert_faithful(_orphan_dlrm(traces, tmp_path))


@pytest.mark.parametrize("rel", PAIRS)
def test_edges_forward_in_time_and_linear_in_count(traces: Path, rel: str) -> None:
    result = convert_pair(traces, rel)
    g = result.graph
    late = 0
    for target, edges in result.deps.preds.items():
        dst = g.by_id[target]
        for e in edges:
            src = g.by_id[e.src]
            assert src.start <= dst.start, f"{e} goes backwards in measured time"
            if e.source.waits:
                late += src.start + src.dur > dst.start + 5.0
    assert late == sum(result.deps.late.values()) == (1 if rel == "gpu/resnet" else 0)
    # the counts (made from the edges given, less those not kept) are those of the kept edges, none of them 0
    kept = [e for edges in result.deps.preds.values() for e in edges]
    assert result.deps.per_source == Counter(e.source for e in kept) and all(result.deps.per_source.values())
    assert result.deps.inferred == Counter(e.source for e in kept if e.inferred)
    assert all(result.deps.inferred.values())
    # every wake-up waits for something: the report's wake-ups, read from the waiting items, are all of them
    wakeups = [it for it in g.items if it.kind == WAKEUP]
    assert all(it.awaits for it in wakeups)
    assert result.report["delays"]["wakeup_micros"]["count"] == len(wakeups)
    # the edges beyond program order, as collected, are those the targets' edges give
    assert result.deps.beyond is not None
    picked = [e for e in kept if e.source not in (Evidence.THREAD_ORDER, Evidence.COLLECTIVE_ORDER)]
    assert sorted(result.deps.beyond, key=_pair) == sorted(picked, key=_pair)
    assert result.report["edges"]["total"] <= 2 * len(result.nodes)
    comm = [n for n in result.nodes if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]
    assert all(n.data_deps for n in comm), "every comm node has a predecessor"
    assert all(not n.ctrl_deps for n in result.nodes)


def test_sync_waits_are_edges_not_durations(traces: Path) -> None:
    result = convert_pair(traces, "gpu/dlrm-8rank/rank0")
    syncs = [it for it in result.graph.items if it.name == "cudaStreamSynchronize" and it.dur > 50]
    assert syncs, "dlrm rank 0 blocks in cudaStreamSynchronize"
    for it in syncs:
        assert it.seg_end == it.start, "the blocking call keeps no waiting time"
    resumed = [it for it in result.graph.items if it.kind == "resume" and it.awaits]
    assert any(a.item for it in resumed for a in it.awaits if a.evidence is Evidence.SYNC)
    longest = max(node_attrs(n).get("measured_duration_micros", 0) or n.duration_micros for n in result.nodes
                  if n.name.startswith("cudaStreamSynchronize"))
    assert longest < 100, "no node carries the ~2 ms the call spent waiting"


def test_what_if_faster_gpu_shortens_the_critical_path(traces: Path) -> None:
    nodes = convert_pair(traces, "gpu/dlrm-8rank/rank0").nodes
    base = asap(nodes)
    base_cp = max(base[n.id] + n.duration_micros for n in nodes)
    halved = {n.id: n.duration_micros / 2 for n in nodes if "stream" in node_attrs(n)}
    fast = asap(nodes, halved)
    dur = {n.id: halved.get(n.id, n.duration_micros) for n in nodes}
    fast_cp = max(fast[n.id] + dur[n.id] for n in nodes)
    assert fast_cp < base_cp * 0.98


def test_what_if_shorter_collective_lets_waiters_start_earlier(traces: Path) -> None:
    nodes = convert_pair(traces, "gpu/dlrm-8rank/rank0").nodes
    comm = max((n for n in nodes if n.type == pb.COMM_COLL_NODE), key=lambda n: n.duration_micros)
    base = asap(nodes)
    shorter = asap(nodes, {comm.id: comm.duration_micros / 10})
    waiters = [n.id for n in nodes if comm.id in n.data_deps]
    assert waiters
    assert all(shorter[i] <= base[i] for i in waiters)
    assert any(shorter[i] < base[i] for i in waiters)


def test_gloo_collective_after_the_op_that_handed_it_over(traces: Path) -> None:
    result = convert_pair(traces, "cpu-gloo/dist_ddp_w2/rank0")
    g = result.graph
    issuing = result.report["link"]["threads"]
    handed = [it for it in g.items if it.comm is not None and it.host is not None
              and it.tid != issuing[str(it.host.et_tid)]]
    assert len(handed) >= 10, "most gloo collectives run on worker threads"
    for it in handed:
        sources = {e.source for e in result.deps.preds.get(it.id, [])}
        assert sources - {"thread_order"}, f"{it.name} has only program order as evidence"


def test_explain_names_predecessors_and_evidence(traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from etweave.commands.convert_cmd import explain
    result = convert_pair(traces, "gpu/dlrm-8rank/rank0")
    kernel = next(it for it in result.graph.items if it.kind == "kernel" and it.launcher is not None)
    text = explain(result, kernel.id)
    assert "by launch" in text and str(kernel.launcher) in text
