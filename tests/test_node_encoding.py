"""The hand encoder of etweave.nodes against protobuf: on every shared trace, each node's bytes are exactly what
`SerializeToString(deterministic=True)` writes for the message they decode to (field order, defaults left out,
packed lists, present-but-empty IOInfo), so the written `.et` files are protobuf's own encoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.convert import Result, run_pipeline
from etweave.nodes import encode_nodes
from etweave.read.kineto import read_kineto
from tests.conftest import PAIRS, convert_pair, traces_root

# every Kineto-only trace but the 224k-node one (the bench and bench.identical cover it)
KINETO_ONLY = sorted(p.name for p in (traces_root() / "kineto-only").glob("*.json.gz")
                     if p.name != "allreduce-2020.json.gz")


def _assert_protobuf_bytes(result: Result) -> None:
    count = 0
    for data, it, ntype, data_deps in encode_nodes(result.graph, result.deps, result.roofline):
        node = pb.Node.FromString(data)
        assert node.SerializeToString(deterministic=True) == data, f"node {it.id} ({it.name})"
        assert (node.id, node.type, tuple(node.data_deps)) == (it.id, ntype, data_deps)
        count += 1
    assert count == len(result.graph.items) > 0


@pytest.mark.parametrize("rel", PAIRS)
def test_pairs_encode_as_protobuf(traces: Path, rel: str) -> None:
    _assert_protobuf_bytes(convert_pair(traces, rel))


@pytest.mark.parametrize("name", KINETO_ONLY)
def test_kineto_only_encodes_as_protobuf(traces: Path, name: str) -> None:
    _assert_protobuf_bytes(run_pipeline(None, read_kineto(traces / "kineto-only" / name)))
