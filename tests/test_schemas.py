"""Every host ET schema of FORMATS.md loads into the same records; the versions no real trace has are synthetic
fixtures derived from a real 1.1.1-chakra.0.0.4 trace in the documented shapes."""

from __future__ import annotations

import copy
import gzip
from pathlib import Path

import orjson
import pytest
from conftest import load_gz, write_gz

from etweave.convert import run_pipeline
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.report import reconciles

REAL = {
    "1.0.1": "gpu/dlrm-8rank/rank0/host.json.gz",
    "1.0.2-chakra.0.0.4": "host-only/chakra_1.0.2.json.gz",
    "1.0.3-chakra.0.0.4": "host-only/resnet_1gpu_1.0.3.json.gz",
    "1.1.0-chakra.0.0.4": "host-only/resnet_2gpu_1.1.0.json.gz",
    "1.1.1-chakra.0.0.4": "cpu-gloo/single_cnn/rank0/host.json.gz",
}
BASE = "cpu-gloo/single_cnn/rank0"


@pytest.mark.parametrize("schema", sorted(REAL))
def test_real_schema_loads(traces: Path, schema: str) -> None:
    host = read_host_et(traces / REAL[schema])
    assert host.schema == schema
    assert host.ops[0].is_process_root
    assert sum(op.is_thread_root for op in host.ops) >= 1
    assert all(op.et_tid >= 0 for op in host.ops)
    assert any(op.inputs.values for op in host.ops)
    assert any(op.rf_id > 0 for op in host.ops)


def _to_1_0_4(doc: dict) -> dict:
    """1.0.4: the nested 1.0.2+ shape with kernel_backend/kernel_file attrs, no strides, no tensor_range."""
    out = copy.deepcopy(doc)
    out["schema"] = "1.0.4-chakra.0.0.4"
    for n in out["nodes"]:
        for io in ("inputs", "outputs"):
            n[io].pop("strides", None)
        n["attrs"] = [a for a in n["attrs"] if a["name"] != "tensor_range"]
    return out


def _to_1_1_1_chakra_1_0_0(doc: dict) -> dict:
    out = copy.deepcopy(doc)
    out["schema"] = "1.1.1-chakra.1.0.0"
    return out


def _to_1_0_1(doc: dict) -> dict:
    """1.0.1: flat nodes, `parent` instead of ctrl_deps, `execution_graph` root names."""
    out = {k: v for k, v in doc.items() if k != "nodes"}
    out["schema"] = "1.0.1"
    out["nodes"] = []
    for n in doc["nodes"]:
        flat = {"id": n["id"], "name": n["name"].replace("execution_trace", "execution_graph"),
                "parent": n["ctrl_deps"]}
        flat.update({a["name"]: a["value"] for a in n["attrs"] if a["name"] not in ("kernel_backend", "kernel_file",
                                                                                  "tensor_range")})
        for io, prefix in (("inputs", "input"), ("outputs", "output")):
            flat[io] = n[io]["values"]
            flat[f"{prefix}_shapes"] = n[io]["shapes"]
            flat[f"{prefix}_types"] = n[io]["types"]
        out["nodes"].append(flat)
    return out


@pytest.mark.parametrize("make", [_to_1_0_4, _to_1_1_1_chakra_1_0_0, _to_1_0_1])
@pytest.mark.parametrize("compressed", [True, False])
def test_synthetic_schema_matches_the_real_trace(traces: Path, tmp_path: Path, make: object,
                                                 compressed: bool) -> None:
    src = traces / BASE
    doc = make(load_gz(src / "host.json.gz"))  # type: ignore[operator]
    if compressed:
        path = write_gz(tmp_path / "host.json.gz", doc)
    else:
        path = tmp_path / "host.json"
        path.write_bytes(orjson.dumps(doc))
    real, synthetic = read_host_et(src / "host.json.gz"), read_host_et(path)
    assert synthetic.schema == doc["schema"]
    key = [(op.id, op.parent, op.et_tid, op.rf_id, op.seq_id, op.inputs.values) for op in real.ops]
    assert [(op.id, op.parent, op.et_tid, op.rf_id, op.seq_id, op.inputs.values) for op in synthetic.ops] == key
    result = run_pipeline(synthetic, read_kineto(src / "kineto.json.gz"))
    assert result.report["link"]["method"] == "rf_id"
    assert reconciles(result.report) == []
    assert result.report["warnings"].get("host_ops_unlinked") == 0


def test_plain_kineto_and_bare_array_form(traces: Path, tmp_path: Path) -> None:
    raw = gzip.decompress((traces / "gpu/simple-add/kineto.json.gz").read_bytes())
    plain = tmp_path / "kineto.json"
    plain.write_bytes(raw)
    bare = tmp_path / "bare.json"
    bare.write_bytes(orjson.dumps(orjson.loads(raw)["traceEvents"]))
    a, b = read_kineto(plain), read_kineto(bare)
    assert len(a.events) == len(b.events) > 50
