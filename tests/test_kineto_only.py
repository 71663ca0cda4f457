"""Kineto traces without a host ET (`etweave convert --device K`): the Kineto cpu ops stand in for host ops.

Real traces from ../shared/traces (ETWEAVE_TRACES overrides; missing traces fail, they do not skip), plus small
synthetic traces for what no real trace has (RCCL's ncclDevKernel_Generic, coalesced kernels without args).
"""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import convert_pair, traces_root

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs
from etweave.check import check_nodes
from etweave.cli import main
from etweave.collectives import _DTYPE_BYTES, classify
from etweave.convert import Result, run_pipeline
from etweave.fidelity import measure
from etweave.link import Selection
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.report import reconciles

KINETO_ONLY = sorted(p.name.removesuffix(".json.gz") for p in (traces_root() / "kineto-only").glob("*.json.gz")) \
    or ["missing"]
GPU_PAIRS = ["gpu/simple-add", "gpu/linear", "gpu/resnet", "gpu/dlrm-8rank/rank0"]
GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
COMM_TYPES = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)

_cache: dict[str, Result] = {}


def kineto_only(root: Path, name: str) -> Result:
    """Convert a kineto-only/ trace once per session (allreduce-2020 has 216k events)."""
    if name not in _cache:
        path = root / "kineto-only" / f"{name}.json.gz"
        if not path.is_file():
            pytest.fail(f"missing trace {path} (set ETWEAVE_TRACES)")
        _cache[name] = run_pipeline(None, read_kineto(path))
    return _cache[name]


def raw_events(root: Path, rel: str) -> list[dict[str, Any]]:
    return orjson.loads(gzip.decompress((root / rel).read_bytes()))["traceEvents"]


def comm_nodes(result: Result) -> list[tuple[pb.Node, dict[str, Any]]]:
    return [(n, node_attrs(n)) for n in result.nodes if n.type in COMM_TYPES]


@pytest.mark.parametrize("name", KINETO_ONLY)
def test_every_kineto_only_trace_converts(traces: Path, name: str) -> None:
    result = kineto_only(traces, name)
    report = result.report
    assert reconciles(report) == []  # every cpu op, runtime call, kernel/memcpy/memset: a node or left out why
    assert check_nodes(result.nodes, name) == []
    assert report["link"]["method"] == "kineto"
    assert report["host_ops"] == {"input": 0, "output": 0}
    assert report["cpu_ops"]["output"] == report["cpu_ops"]["input"] > 0  # no selection: every cpu op
    assert sum(1 for n in result.nodes if node_attrs(n).get("kind") == "host_op") == report["cpu_ops"]["output"]
    assert report["warnings"]["gpu_ops_without_launcher"] == 0  # CUDA and HIP launches alike
    assert measure(result.nodes).no_predecessor == []


def test_allreduce_2020_keeps_every_allreduce(traces: Path) -> None:
    result = kineto_only(traces, "allreduce-2020")
    kernels = [n for n in result.nodes if n.name.startswith("ncclKernel_AllReduce")]
    assert len(kernels) == 2020
    assert all(n.type == pb.COMM_COLL_NODE and node_attrs(n)["comm_type"] == pb.ALL_REDUCE for n in kernels)
    assert result.report["collectives"] == {"input": 2020, "output": 2020}
    # this old trace records no sizes anywhere (no NCCL args, no Input Dims): said, not guessed
    assert result.report["warnings"]["collective_size_unknown"] == 2020


def test_nccl_args_give_type_and_size(traces: Path) -> None:
    rel = "kineto-only/nccl-broadcast-allreduce.json.gz"
    want = Counter()
    for ev in raw_events(traces, rel):
        a = ev.get("args", {})
        if ev.get("cat") == "kernel" and "Collective name" in a:
            want[(a["Collective name"], a["In msg nelems"] * _DTYPE_BYTES[a["dtype"].lower()], ev["name"])] += 1
    assert {name for name, _, _ in want} == {"broadcast", "allreduce"}
    result = kineto_only(traces, "nccl-broadcast-allreduce")
    got = Counter((a["collective_name"], a["comm_size"], n.name) for n, a in comm_nodes(result))
    assert got == want
    types = Counter(a["comm_type"] for _, a in comm_nodes(result))
    assert types == {pb.BROADCAST: 6, pb.ALL_REDUCE: 15}


@pytest.mark.parametrize("rank", [0, 1])
def test_sendrecv_kernels_take_their_type_from_the_enclosing_op(traces: Path, rank: int) -> None:
    rel = f"kineto-only/sendrecv-rank{rank}.json.gz"
    events = raw_events(traces, rel)
    # Independent of etweave: each SendRecv kernel -> its launch -> the innermost nccl:* op around the launch.
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    nccl_ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
                and e["name"].startswith("nccl:")]
    expected: dict[tuple[float, str], str] = {}
    for k in events:
        if k.get("cat") == "kernel" and k["name"].startswith("ncclKernel_SendRecv"):
            r = launch[k["args"]["correlation"]]
            around = [e for e in nccl_ops if e["tid"] == r["tid"] and e["ts"] <= r["ts"]
                      and r["ts"] + r["dur"] <= e["ts"] + e["dur"]]
            expected[(round(k["ts"]), k["name"])] = min(around, key=lambda e: e["dur"])["name"]
    assert Counter(expected.values()) == {"nccl:all_to_all": 4, "nccl:all_reduce": 4, "nccl:_all_gather_base": 2}
    type_of = {"nccl:all_to_all": pb.ALL_TO_ALL, "nccl:all_reduce": pb.ALL_REDUCE,
               "nccl:_all_gather_base": pb.ALL_GATHER}
    result = kineto_only(traces, f"sendrecv-rank{rank}")
    got = {(n.start_time_micros, n.name): a["comm_type"] for n, a in comm_nodes(result)}
    assert got == {key: type_of[op] for key, op in expected.items()}
    assert all(a["comm_size"] > 0 for _, a in comm_nodes(result))  # from the ops' Input Dims x Input type
    assert not any(k.startswith("collective_type_from") for k in result.report["warnings"])


def test_hip_launches_link_their_kernels(traces: Path) -> None:
    result = kineto_only(traces, "amd-mi250")
    by_id = {n.id: n for n in result.nodes}
    gpu = [n for n in result.nodes if node_attrs(n).get("kind") in GPU_KINDS]
    assert len(gpu) == 16
    for n in gpu:  # each GPU op depends on the hip* call that launched it
        launchers = [by_id[d].name for d in n.data_deps if node_attrs(by_id[d]).get("kind") == "runtime"]
        assert len(launchers) == 1 and launchers[0].startswith("hip"), n.name


@pytest.mark.parametrize("rel", GPU_PAIRS)
def test_pair_window_matches_the_pair(traces: Path, rel: str) -> None:
    pair = convert_pair(traces, rel)
    lo, hi = pair.report["link"]["window_us"]
    alone = run_pipeline(None, read_kineto(traces / rel / "kineto.json.gz"), select=Selection(window=(lo, hi)))
    assert reconciles(alone.report) == []
    assert check_nodes(alone.nodes, rel) == []
    assert _gpu_events(alone) == _gpu_events(pair)
    assert _collectives(alone) == _collectives(pair)
    f = measure(alone.nodes)
    assert abs(f.critical_path_error) <= 2.0
    assert f.start_error_p95 <= 2.0
    assert f.start_error_max <= 5.0
    assert f.collective_error_max <= 5.0


@pytest.mark.parametrize("rel", ["cpu-gloo/dist_ddp_w2/rank0", "cpu-gloo/dist_fsdp1_w2/rank1"])
def test_gloo_collectives_without_host_et(traces: Path, rel: str) -> None:
    # gloo ops run on worker threads: without a host ET their c10d call is found on the issuing thread anyway
    pair = convert_pair(traces, rel)
    lo, hi = pair.report["link"]["window_us"]
    alone = run_pipeline(None, read_kineto(traces / rel / "kineto.json.gz"), select=Selection(window=(lo, hi)))
    assert reconciles(alone.report) == []
    assert _collectives(alone) == _collectives(pair)
    assert alone.report["collectives"] == pair.report["collectives"]


def _gpu_events(result: Result) -> list[tuple[Any, ...]]:
    out = []
    for n in result.nodes:
        a = node_attrs(n)
        if a.get("kind") in GPU_KINDS:
            dur = a["measured_duration_micros"] if n.type in COMM_TYPES else n.duration_micros
            out.append((n.name, n.start_time_micros, dur, a["device"], a["stream"]))
    return sorted(out)


def _collectives(result: Result) -> list[tuple[Any, ...]]:
    return sorted((n.name, n.start_time_micros, n.type, a["comm_type"], a["comm_size"], a["collective_name"],
                   a["pg_name"]) for n, a in comm_nodes(result))


def test_steps_select_profiler_steps(traces: Path) -> None:
    path = traces / "kineto-only" / "nccl-broadcast-allreduce.json.gz"
    kineto = read_kineto(path)
    step = next(e for e in kineto.events if e.name == "ProfilerStep#5" and e.cat == "user_annotation")
    result = run_pipeline(None, kineto, select=Selection.parse(steps="5:5"))
    assert result.report["link"]["window_us"] == [step.ts, step.ts + step.dur]
    assert reconciles(result.report) == []
    left = {lo["kind"]: lo["reason"] for lo in result.report["left_out"]}
    assert left == {"cpu_ops": "outside_window", "device_ops": "outside_window", "runtime_calls": "outside_window"}
    ops = [n for n in result.nodes if node_attrs(n).get("kind") == "host_op"]
    assert ops and all(step.ts <= n.start_time_micros + 1 and n.start_time_micros <= step.ts + step.dur + 1
                       for n in ops)
    assert "ProfilerStep#5" in {n.name for n in ops} and "ProfilerStep#4" not in {n.name for n in ops}
    both = run_pipeline(None, read_kineto(path), select=Selection.parse(steps="4:6"))
    assert both.report["cpu_ops"]["output"] > result.report["cpu_ops"]["output"]


def test_window_with_host_limits_the_device_events(traces: Path) -> None:
    rel = "gpu/linear"
    pair = convert_pair(traces, rel)
    lo, hi = pair.report["link"]["window_us"]
    mid = (lo + hi) / 2
    cut = run_pipeline(read_host_et(traces / rel / "host.json.gz"), read_kineto(traces / rel / "kineto.json.gz"),
                       select=Selection(window=(lo, mid)))
    assert cut.report["link"]["window_us"] == [lo, mid]
    assert 0 < cut.report["device_ops"]["output"] < pair.report["device_ops"]["output"]
    assert cut.report["host_ops"] == pair.report["host_ops"]  # the host ET is kept whole
    assert reconciles(cut.report) == []


@pytest.mark.parametrize("args", [
    ["--steps", "x"], ["--steps", "5:4"], ["--steps", "99"], ["--window", "nope"], ["--window", "3:1"],
    ["--window", "1:2"], ["--steps", "4", "--window", ":"],
])
def test_bad_selection_is_bad_input(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    args: list[str]) -> None:
    path = traces / "kineto-only" / "nccl-broadcast-allreduce.json.gz"
    code = main(["convert", "--device", str(path), "-o", str(tmp_path / "x.et"), "--quiet", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("etweave: error: --")
    assert not (tmp_path / "x.et").exists()


def test_cli_kineto_only(traces: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "amd.et", tmp_path / "amd.json"
    path = traces / "kineto-only" / "amd-mi250.json.gz"
    assert main(["convert", "--device", str(path), "-o", str(out), "--report", str(report), "--quiet",
                 "--steps", "1"]) == 0
    rep = orjson.loads(report.read_bytes())
    assert reconciles(rep) == [] and rep["cpu_ops"]["output"] > 0
    assert main(["check", str(out)]) == 0


# --- synthetic traces: shapes FORMATS.md documents but no real trace here has ---------------------------------

def _x(cat: str, name: str, ts: float, dur: float, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _gpu(cat: str, name: str, ts: float, dur: float, corr: int, stream: int = 3, **args: Any) -> dict[str, Any]:
    return _x(cat, name, ts, dur, stream, device=0, stream=stream, correlation=corr, **args)


def _convert(tmp_path: Path, events: list[dict[str, Any]]) -> Result:
    path = tmp_path / "k.json"
    path.write_bytes(orjson.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 2}}))
    result = run_pipeline(None, read_kineto(path))
    assert reconciles(result.report) == []
    assert check_nodes(result.nodes, "synthetic") == []
    return result


def test_rccl_generic_kernel_takes_the_enclosing_nccl_op(tmp_path: Path) -> None:
    generic = "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)"
    result = _convert(tmp_path, [
        _x("cpu_op", "aten::add", 0, 20, 1),
        _x("cuda_runtime", "hipLaunchKernel", 5, 5, 1, correlation=1),
        _x("user_annotation", "nccl:all_reduce", 30, 40, 1, **{"Input Dims": [[1024]], "Input type": ["float"]}),
        _x("cuda_runtime", "hipExtLaunchKernel", 40, 10, 1, correlation=2),
        _x("cuda_runtime", "hipMemcpyAsync", 80, 10, 1, correlation=3),
        _gpu("kernel", "void at::native::vectorized_elementwise_kernel<4>", 12, 4, 1, stream=0),
        _gpu("kernel", generic, 45, 30, 2),
        _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Host)", 82, 3, 3, stream=0),
    ])
    (node, attrs), = comm_nodes(result)
    assert node.name == generic and node.type == pb.COMM_COLL_NODE
    assert attrs["comm_type"] == pb.ALL_REDUCE and attrs["comm_size"] == 4096
    assert not any(k.startswith("collective_type_from") for k in result.report["warnings"])
    assert result.report["collectives"] == {"input": 1, "output": 1}
    assert result.report["device_ops"] == {"input": 3, "output": 3}


def test_coalesced_kernels_without_metadata_are_counted(tmp_path: Path) -> None:
    result = _convert(tmp_path, [
        # a coalesced all-gather: one kernel under nccl:coalesced, no NCCL args on it
        _x("cpu_op", "c10d::allgather_into_tensor_coalesced_", 0, 50, 1),
        _x("user_annotation", "nccl:coalesced", 10, 30, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 15, 5, 1, correlation=1),
        # a bare coalesced group (e.g. batched p2p): the kernel name is all there is
        _x("user_annotation", "nccl:coalesced", 60, 20, 1),
        _x("cuda_runtime", "cudaLaunchKernelExC", 65, 5, 1, correlation=2),
        # an ordinary collective with its metadata: not counted
        _x("user_annotation", "nccl:all_reduce", 100, 20, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 105, 5, 1, correlation=3),
        _gpu("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 10, 1),
        _gpu("kernel", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 70, 10, 2),
        _gpu("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 110, 5, 3,
             **{"Collective name": "allreduce", "In msg nelems": 256, "dtype": "Float", "Seq": 4}),
    ])
    types = [(n.name.split("(")[0], a["comm_type"], a["comm_size"]) for n, a in comm_nodes(result)]
    assert types == [("ncclDevKernel_AllGather_RING_LL", pb.ALL_GATHER, 0),
                     ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", pb.REDUCE_SCATTER, 0),
                     ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", pb.ALL_REDUCE, 1024)]
    warnings = result.report["warnings"]
    assert warnings["collective_coalesced_without_metadata"] == 2
    assert warnings["collective_size_unknown"] == 2
    assert warnings["collective_type_from_kernel_name"] == 1  # the bare group; the other had its c10d call


def test_cpu_op_parents_follow_time_containment(tmp_path: Path) -> None:
    result = _convert(tmp_path, [
        _x("user_annotation", "ProfilerStep#3", 0, 100, 1),
        _x("cpu_op", "aten::linear", 10, 40, 1, **{"Sequence number": 12, "Record function id": 5}),
        _x("cpu_op", "aten::addmm", 10, 30, 1),  # same start: the longer one is the outer one
        _x("cpu_op", "aten::relu", 60, 10, 1),
        # a backward op runs after its forward op ended (README "Dependencies": autograd)
        _x("cpu_op", "autograd::engine::evaluate_function", 52, 5, 2, **{"Sequence number": 12}),
    ])
    by_name = {n.name: n for n in result.nodes}
    attrs = {name: node_attrs(n) for name, n in by_name.items()}
    assert attrs["aten::addmm"]["et_parent"] == by_name["aten::linear"].id
    assert attrs["aten::linear"]["et_parent"] == by_name["ProfilerStep#3"].id
    assert attrs["aten::relu"]["et_parent"] == by_name["ProfilerStep#3"].id
    by_id = {n.id: n for n in result.nodes}
    roots = {attrs[name]["et_parent"] for name in ("ProfilerStep#3", "autograd::engine::evaluate_function")}
    assert len(roots) == 2  # one thread root per Kineto thread
    # roots are zero-duration COMP_NODEs (ASTRA-sim aborts on METADATA_NODE); the kind attr says what they are
    assert all(node_attrs(by_id[r])["kind"] == "thread_root" and by_id[r].type == pb.COMP_NODE
               and by_id[r].duration_micros == 0 for r in roots)
    assert {node_attrs(by_id[r])["tid"] for r in roots} == {1, 2}
    assert attrs["aten::linear"]["seq_id"] == 12 and attrs["aten::linear"]["rf_id"] == 5
    assert attrs["ProfilerStep#3"]["seq_id"] == -1
    # entry order: ids grow with start time, outer before inner at equal starts
    assert by_name["ProfilerStep#3"].id < by_name["aten::linear"].id < by_name["aten::addmm"].id \
        < by_name["autograd::engine::evaluate_function"].id < by_name["aten::relu"].id
    # the backward op on the other thread follows its forward op (same sequence number)
    backward = by_name["autograd::engine::evaluate_function"]
    assert by_name["aten::linear"].id in backward.data_deps


@pytest.mark.parametrize(("name", "kind"), [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", pb.ALL_REDUCE),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", pb.BROADCAST),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", pb.ALL_GATHER),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", pb.REDUCE_SCATTER),
    ("ncclDevKernel_AllReduce_Sum_bf16_TREE_LL128(ncclDevKernelArgsStorage<4096ul>)", pb.ALL_REDUCE),
    ("ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", pb.REDUCE),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", None),  # ambiguous
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", None),
    ("ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)", None),  # RCCL: every kernel is this
])
def test_kernel_name_fallback(name: str, kind: int | None) -> None:
    assert classify(name) == kind


def test_trace_without_cpu_ops(tmp_path: Path) -> None:
    result = _convert(tmp_path, [
        _x("cuda_runtime", "cudaLaunchKernel", 0, 5, 1, correlation=1),
        _gpu("kernel", "k", 3, 5, 1),
    ])
    assert result.report["cpu_ops"] == {"input": 0, "output": 0}
    assert result.report["device_ops"] == {"input": 1, "output": 1}
