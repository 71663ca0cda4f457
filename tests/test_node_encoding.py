"""The hand encoder of etweave.nodes against protobuf: on every shared trace, each node's bytes are exactly what
`SerializeToString(deterministic=True)` writes for the message they decode to (field order, defaults left out,
packed lists, present-but-empty IOInfo), so the written `.et` files are protobuf's own encoding."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from etweave import nodes as nodes_module
from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import framed_et_chunks, parse, serialize_encoded
from etweave.convert import Result, run_pipeline
from etweave.nodes import encode_nodes, node_type
from etweave.read.host_et import PG_INIT_NAME
from etweave.read.kineto import read_kineto
from tests.conftest import PAIRS, convert_pair, traces_root

# every Kineto-only trace but the 224k-node one (the bench and bench.identical cover it)
KINETO_ONLY = sorted(p.name for p in (traces_root() / "kineto-only").glob("*.json.gz")
                     if p.name != "allreduce-2020.json.gz")


def _assert_protobuf_bytes(result: Result) -> None:
    encoded = encode_nodes(result.graph, result.deps, result.roofline)
    nodes = list(encoded)
    for data, it, data_deps in zip(nodes, result.graph.items, encoded.data_deps, strict=True):
        node = pb.Node.FromString(data)
        assert node.SerializeToString(deterministic=True) == data, f"node {it.id} ({it.name})"
        assert (node.id, node.type, tuple(node.data_deps)) == (it.id, node_type(it), data_deps)
    # the nodes the self-check decodes in full: every one but plain COMP nodes
    assert encoded.in_full == [data for data, it in zip(nodes, result.graph.items, strict=True)
                               if node_type(it) != pb.COMP_NODE or it.name == PG_INIT_NAME]
    assert len(nodes) == len(result.graph.items) > 0


@pytest.mark.parametrize("rel", PAIRS)
def test_pairs_encode_as_protobuf(traces: Path, rel: str) -> None:
    _assert_protobuf_bytes(convert_pair(traces, rel))


@pytest.mark.parametrize("name", KINETO_ONLY)
def test_kineto_only_encodes_as_protobuf(traces: Path, name: str) -> None:
    _assert_protobuf_bytes(run_pipeline(None, read_kineto(traces / "kineto-only" / name)))


def test_nodes_encoded_again_are_the_same(traces: Path) -> None:
    """The audit's rounded times are let go once the nodes are encoded (the self-check's memory is the conversion's
    peak); encoding again rounds them anew, to the same bytes."""
    result = run_pipeline(None, read_kineto(traces / "kineto-only" / "amd-mi250.json.gz"))
    assert result.times is not None
    first = list(result.encoded_nodes())
    assert result.times is None and first
    assert list(result.encoded_nodes()) == first


def test_framed_nodes_are_the_stream_of_the_nodes(traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    """What `etweave convert` writes (each node framed in the batch loop) is the .et stream of the nodes one at a
    time, plain and gzip, and progress is told every node once."""
    monkeypatch.setattr(nodes_module, "_BATCH", 50)  # (batches of 50: several, the last one short)
    result = run_pipeline(None, read_kineto(traces / "kineto-only" / "amd-mi250.json.gz"))
    nodes = list(result.encoded_nodes())
    assert len(nodes) % 50
    counts: list[int] = []
    framed = list(result.framed_nodes(counts.append))
    assert len(framed) == len(counts) == len(nodes) // 50 + 1 and sum(counts) == len(nodes)
    plain = tmp_path / "x.et"
    assert b"".join(framed_et_chunks(plain, result.metadata_bytes, framed)) == serialize_encoded(
        result.metadata_bytes, nodes)
    gz = b"".join(framed_et_chunks(tmp_path / "x.et.gz", result.metadata_bytes, framed))
    assert gzip.decompress(gz) == serialize_encoded(result.metadata_bytes, nodes)
    _, read = parse(gzip.decompress(gz))
    assert [n.SerializeToString(deterministic=True) for n in read] == nodes


def test_a_failed_self_check_stops_the_framed_stream(traces: Path) -> None:
    result = run_pipeline(None, read_kineto(traces / "kineto-only" / "amd-mi250.json.gz"))
    first = result.graph.items[0].id
    result.deps.preds[first] = result.deps.preds[result.graph.items[1].id]  # a dep on a later node, and back
    with pytest.raises(RuntimeError, match="output failed its own check"):
        b"".join(result.framed_nodes())
