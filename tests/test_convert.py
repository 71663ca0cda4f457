"""The core converter on every real pair: nothing lost, every id kept, a valid DAG, a report that reconciles."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import PAIRS, convert_pair, load_gz, write_gz

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs, read_et
from etweave.check import check_nodes
from etweave.cli import main
from etweave.convert import convert, run_pipeline
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.report import reconciles


@pytest.mark.parametrize("rel", PAIRS)
def test_pair_keeps_everything(traces: Path, rel: str) -> None:
    result = convert_pair(traces, rel)
    host = read_host_et(traces / rel / "host.json.gz")
    ids = {n.id for n in result.nodes}
    assert {op.id for op in host.ops} <= ids, "every host ET node keeps its id"
    assert reconciles(result.report) == []
    assert check_nodes(result.nodes, rel) == []  # unique ids, no dangling or self edges, acyclic, attr types
    assert result.report["host_ops"]["input"] == len(host.ops) == result.report["host_ops"]["output"]


@pytest.mark.parametrize("rel", PAIRS)
def test_warnings_zero_or_explained(traces: Path, rel: str) -> None:
    warnings = {k: v for k, v in convert_pair(traces, rel).report["warnings"].items() if v}
    if rel in ("gpu/dlrm-8rank/rank1", "gpu/dlrm-8rank/rank3"):
        # README: these ranks really have 64 optimizer kernels with no launch record
        assert warnings == {"gpu_ops_without_launcher": 64}
    elif rel == "gpu/resnet":
        # README: a pageable copy's call returns before the DMA's recorded end
        assert warnings == {"wait_edges_ending_late_sync": 1}
    else:
        assert warnings == {}


@pytest.mark.parametrize("name", ["hf_GPT2", "pt2", "resnet_2gpu_1.1.0", "resnet_1gpu_1.0.3", "chakra_1.0.2"])
def test_host_only(traces: Path, name: str) -> None:
    host = read_host_et(traces / "host-only" / f"{name}.json.gz")
    result = run_pipeline(host, None)
    assert {op.id for op in host.ops} <= {n.id for n in result.nodes}
    assert reconciles(result.report) == []
    assert check_nodes(result.nodes, name) == []


def test_dlrm_every_rank(traces: Path) -> None:
    for rank in range(8):
        rel = f"gpu/dlrm-8rank/rank{rank}"
        result = convert_pair(traces, rel)
        report = result.report
        assert report["device_ops"]["input"] == report["device_ops"]["output"], "no GPU event left out"
        comm = Counter(node_attrs(n)["comm_type"] for n in result.nodes if n.type == pb.COMM_COLL_NODE)
        assert comm == {pb.ALL_TO_ALL: 5, pb.ALL_REDUCE: 3}
        no_launch = [it for it in result.graph.items if it.kind == "kernel" and it.launcher is None]
        assert len(no_launch) == (64 if rank in (1, 3) else 0)
        assert report["link"]["seq_offset"] == 40 and "note" in report["link"]


@pytest.mark.parametrize("rel", [p for p in PAIRS if "dlrm" in p or "linear" in p or "resnet" in p] or ["x"])
def test_linked_ops_match_names_and_entry_order(traces: Path, rel: str) -> None:
    result = convert_pair(traces, rel)
    events = read_kineto(traces / rel / "kineto.json.gz").events
    # a measured op took its thread, start and duration from the Kineto event it is linked to
    measured = {(events.tid[i], events[i].ts, events[i].dur, events[i].name) for i in events.cpu}
    by_thread: dict[object, list[tuple[int, float]]] = {}
    for it in result.graph.items:
        if it.kind == "host_op" and it.measured:
            assert (it.tid, it.start, it.dur, it.name) in measured
            by_thread.setdefault(it.tid, []).append((it.id, it.start))
    for ops in by_thread.values():
        starts = [s for _, s in sorted(ops)]
        assert starts == sorted(starts), "ids are handed out at op entry: start times follow ids"
    assert sum(len(v) for v in by_thread.values()) >= 0.99 * result.report["host_ops"]["input"] - 3


def test_gloo_collectives_are_worker_thread_comm_nodes(traces: Path) -> None:
    result = convert_pair(traces, "cpu-gloo/dist_ddp_w2/rank0")
    comm = [n for n in result.nodes if n.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]
    assert len(comm) == result.report["collectives"]["output"] == 22
    names = Counter(node_attrs(n)["collective_name"] for n in comm)
    assert names["reduce_scatter_base"] == 2, "the type comes from the c10d op, not gloo:all_reduce"
    main_tid = result.graph.threads and min(result.graph.threads, key=lambda t: len(str(t)))
    for n in comm:
        a = node_attrs(n)
        assert a["is_cpu_op"] is False and a["comm_size"] >= 0
        assert n.name.startswith("gloo:")
    sends = [n for n in comm if n.type == pb.COMM_SEND_NODE]
    assert sends and all(node_attrs(n)["comm_src"] == 0 and node_attrs(n)["comm_dst"] == 1 for n in sends)
    assert main_tid is not None


def _drop_nodes(doc: dict, names: set[str]) -> dict:
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] not in names]
    return doc


def test_orphans_from_deleted_parents_are_kept(traces: Path, tmp_path: Path) -> None:
    src = traces / "gpu/dlrm-8rank/rank0"
    host = write_gz(tmp_path / "host.json.gz",
                    _drop_nodes(load_gz(src / "host.json.gz"), {"## forward ##", "## sparse_data_dist ##"}))
    result = run_pipeline(read_host_et(host), read_kineto(src / "kineto.json.gz"))
    orphans = result.report["orphans"]
    assert orphans["count"] == 27
    below = [c for m in orphans["missing_parents"] for c in m["collectives"]]
    assert below.count("c10d::alltoall_base_") == 4
    assert reconciles(result.report) == []
    assert check_nodes(result.nodes, "orphans") == []
    comm = [n for n in result.nodes if n.type == pb.COMM_COLL_NODE]
    assert len(comm) == 8 and all(n.data_deps for n in comm), "orphaned collectives get real predecessors"
    kept = {n.id for n in result.nodes}
    assert {op["id"] for op in load_gz(host)["nodes"]} <= kept


def test_orphan_wiki_single(traces: Path) -> None:
    result = convert_pair(traces, "cpu-gloo/orphan_wiki_single/rank0")
    assert result.report["orphans"]["count"] == 38
    assert result.report["orphans"]["missing_parents"][0]["nodes_below"] == 209
    orphans = [n for n in result.nodes if "orphan_parent" in node_attrs(n)]
    assert len(orphans) == 38 and all(n.data_deps for n in orphans)


def test_link_without_record_function_id(traces: Path, tmp_path: Path) -> None:
    """Strip `Record function id` from a cpu-gloo Kineto trace: the aligner must link as well as rf_id does."""
    src = traces / "cpu-gloo/single_cnn/rank0"
    doc = load_gz(src / "kineto.json.gz")
    for ev in doc["traceEvents"]:
        ev.get("args", {}).pop("Record function id", None)
    kineto = write_gz(tmp_path / "kineto.json.gz", doc)
    by_rf = run_pipeline(read_host_et(src / "host.json.gz"), read_kineto(src / "kineto.json.gz"))
    by_align = run_pipeline(read_host_et(src / "host.json.gz"), read_kineto(kineto))
    assert by_rf.report["link"]["method"] == "rf_id" and by_align.report["link"]["method"] == "alignment"
    linked_rf = {it.id: it.start for it in by_rf.graph.items if it.measured and it.host is not None}
    linked_al = {it.id: it.start for it in by_align.graph.items if it.measured and it.host is not None}
    assert linked_al == linked_rf


def test_cli_convert_and_jsonize(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = traces / "gpu/simple-add"
    out, rep = tmp_path / "t.et", tmp_path / "r.json"
    code = main(["convert", "--host", str(src / "host.json.gz"), "--device", str(src / "kineto.json.gz"),
                 "-o", str(out), "--report", str(rep), "--explain", "2"])
    assert code == 0 and out.exists() and rep.exists()
    printed = capsys.readouterr().out
    assert "host_ops" in printed and "node 2 " in printed
    metadata, nodes = read_et(out)
    assert metadata.version and len(nodes) == len(convert_pair(traces, "gpu/simple-add").nodes)
    assert main(["jsonize", str(out)]) == 0
    assert '"nodes"' in capsys.readouterr().out


def test_bad_input_is_one_line_and_no_output(traces: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [')
    out = tmp_path / "out.et"
    proc = subprocess.run([sys.executable, "-m", "etweave", "convert", "--host", str(bad), "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "bad.json" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]
    kineto_as_host = subprocess.run(
        [sys.executable, "-m", "etweave", "convert", "--host", str(traces / "gpu/simple-add/kineto.json.gz"),
         "-o", str(out)], capture_output=True, text=True)
    assert kineto_as_host.returncode == 2 and "looks like a Kineto trace" in kineto_as_host.stderr


def test_same_input_same_bytes(traces: Path, tmp_path: Path) -> None:
    src = traces / "cpu-gloo/dist_ddp_w2/rank0"
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"t{seed}.et"
        subprocess.run([sys.executable, "-m", "etweave", "convert", "--host", str(src / "host.json.gz"),
                        "--device", str(src / "kineto.json.gz"), "-o", str(out), "--report",
                        str(tmp_path / f"r{seed}.json"), "--quiet"],
                       check=True, env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"})
        outs.append((out.read_bytes(), (tmp_path / f"r{seed}.json").read_bytes()))
    assert outs[0] == outs[1]


def test_plain_and_gzip_inputs_agree(traces: Path, tmp_path: Path) -> None:
    import gzip
    src = traces / "gpu/simple-add"
    plain_host = tmp_path / "host.json"
    plain_host.write_bytes(gzip.decompress((src / "host.json.gz").read_bytes()))
    plain_kineto = tmp_path / "kineto.json"
    plain_kineto.write_bytes(gzip.decompress((src / "kineto.json.gz").read_bytes()))
    convert(plain_host, plain_kineto, tmp_path / "a.et")
    convert(src / "host.json.gz", src / "kineto.json.gz", tmp_path / "b.et")
    # the metadata names the source files; the nodes must be identical
    assert read_et(tmp_path / "a.et")[1] == read_et(tmp_path / "b.et")[1]


@pytest.mark.parametrize("rel", ["gpu/dlrm-8rank/rank1", "gpu/linear", "cpu-gloo/dist_ddp_w2/rank0"])
def test_lazy_reading_gives_the_same_output(traces: Path, rel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large traces keep raw JSON and decode on access (ETWEAVE_EAGER_BYTES); the output must not change."""
    d = traces / rel
    eager = run_pipeline(read_host_et(d / "host.json.gz"), read_kineto(d / "kineto.json.gz"))
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", "0")
    kineto = read_kineto(d / "kineto.json.gz")
    assert kineto.events._events is None, "the lazy path was taken"
    lazy = run_pipeline(read_host_et(d / "host.json.gz"), kineto)
    assert lazy.nodes == eager.nodes and lazy.report == eager.report
