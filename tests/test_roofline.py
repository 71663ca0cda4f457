"""num_ops / tensor_size on every COMP_NODE (FORMATS.md 3b.3): real values from the launching op's shapes, spread
over its GPU events; checked against hand computations on the real gpu/ traces."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import convert_pair

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs
from etweave.model import GPU_KINDS
from etweave.roofline import op_work, spread


def _roofline(node: pb.Node) -> tuple[int, int]:
    a = node_attrs(node)
    return a["num_ops"], a["tensor_size"]


def test_one_linear_layer_by_hand(traces: Path) -> None:
    result = convert_pair(traces, "gpu/linear")
    g = result.graph
    addmm = next(it for it in g.items if it.name == "aten::addmm" and it.host is not None
                 and it.host.inputs.shapes[:3] == [[1024], [512, 1024], [1024, 1024]])
    # y = x W^T + b with x 512x1024 and W 1024x1024: 2*M*K*N multiply-adds, + M*N for adding the bias
    m, k, n = 512, 1024, 1024
    flops = 2 * m * k * n + m * n
    moved = 4 * (1024 + m * k + k * n + m * n)  # float32: bias, x, W in; y out
    assert addmm.host is not None
    work = op_work(addmm.name, addmm.host)
    assert work is not None and (work.flops, work.bytes) == (flops, moved)
    # spread over the kernels this op launched, summing to the op's total
    kernels = [it for it in g.items if it.kind in GPU_KINDS and it.launcher is not None
               and g.by_id[it.launcher].enclosing == addmm.id]
    assert kernels, "the addmm launched kernels"
    by_id = {nd.id: nd for nd in result.nodes}
    values = [_roofline(by_id[it.id]) for it in kernels]
    assert sum(v[0] for v in values) == flops and sum(v[1] for v in values) == moved


def test_first_conv_of_resnet_by_hand(traces: Path) -> None:
    g = convert_pair(traces, "gpu/resnet").graph
    conv = next(it for it in g.items if it.name == "aten::cudnn_convolution" and it.host is not None
                and it.host.inputs.shapes[0] == [128, 3, 224, 224])
    assert conv.host is not None
    work = op_work(conv.name, conv.host)
    # 7x7 conv, 3 -> 64 channels, stride 2: output 128x64x112x112, each output element 3*7*7 multiply-adds
    assert work is not None and work.flops == 2 * (128 * 64 * 112 * 112) * (3 * 7 * 7)
    assert work.bytes == 4 * (128 * 3 * 224 * 224 + 64 * 3 * 7 * 7 + 128 * 64 * 112 * 112)


@pytest.mark.parametrize("pair", ["gpu/linear", "gpu/resnet"])
def test_real_values_cover_most_gpu_time(traces: Path, pair: str) -> None:
    result = convert_pair(traces, pair)
    g = result.graph
    gpu_time = sum(it.dur for it in g.items if it.kind in GPU_KINDS)
    by_id = {nd.id: nd for nd in result.nodes}
    covered = sum(it.dur for it in g.items if it.kind in GPU_KINDS and _roofline(by_id[it.id])[1] > 0)
    assert covered >= 0.8 * gpu_time, f"{covered / gpu_time:.1%} of GPU kernel time has real values"
    rf = result.report["roofline"]
    assert rf["gpu_time_covered_pct"] == pytest.approx(100 * covered / gpu_time, abs=0.01)
    comp = [nd for nd in result.nodes if nd.type == pb.COMP_NODE]
    assert all("num_ops" in node_attrs(nd) and "tensor_size" in node_attrs(nd) for nd in comp)
    real = sum(1 for nd in comp if _roofline(nd)[1] > 0)
    assert (rf["comp_nodes"], rf["real_values"], rf["zero_values"]) == (len(comp), real, len(comp) - real)
    assert real > 0 and rf["zero_values"] > 0  # CPU nodes keep zeros: ASTRA-sim replays them from duration
    cpu_real = [nd.name for nd in comp if node_attrs(nd)["is_cpu_op"] and _roofline(nd) != (0, 0)]
    assert cpu_real == []


def test_spread_sums_to_the_total() -> None:
    assert spread(10, [1.0, 1.0, 1.0]) == [4, 3, 3]
    assert spread(7, [0.0, 0.0]) == [4, 3]  # no duration: equal shares
    assert spread(1_000_003, [3.5, 0.0, 1.5]) == [700002, 0, 300001]
    assert sum(spread(123_456_789, [0.3, 7.1, 2.2, 0.0, 9.9])) == 123_456_789
    assert spread(5, []) == []
