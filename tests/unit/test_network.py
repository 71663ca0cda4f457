"""simulate/network.py: the analytical network model and its config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.errors import BadInput
from etweave.simulate.network import DEFAULT_NETWORK, Network, collective_ns, hops, load_network


def test_load_network(tmp_path: Path) -> None:
    path = tmp_path / "net.yml"
    path.write_text("# a comment\ntopology: [ Switch ]\nnpus_count: [ 4 ]\nbandwidth: [ 25.0 ]  # GB/s\n"
                    "latency: [ 100 ]\n")
    assert load_network(path) == Network("Switch", 25.0, 100.0, source="net.yml", npus_count=4)


@pytest.mark.parametrize(("text", "message"), [
    ("topology: [ Ring ]\nbandwidth: [ 1 ]\n", "no 'latency'"),
    ("topology: [ Ring, Ring ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n", "more than one dimension"),
    ("topology: [ Torus ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n", "only Ring and Switch"),
    ("topology: [ Ring ]\nbandwidth: [ 0 ]\nlatency: [ 1 ]\n", "bandwidth must be > 0"),
    ("what is this\n", "not a network config line"),
])
def test_bad_network_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "net.yml"
    path.write_text(text)
    with pytest.raises(BadInput, match=message):
        load_network(path)


def test_collective_times() -> None:
    assert collective_ns(DEFAULT_NETWORK, pb.ALL_REDUCE, 0, 8) == 0  # a comm_size of 0 is free (FACTS.md §A4)
    assert collective_ns(DEFAULT_NETWORK, pb.ALL_REDUCE, 1 << 20, 1) == 0
    small, large = (collective_ns(DEFAULT_NETWORK, pb.ALL_REDUCE, size, 4) for size in (1 << 10, 1 << 24))
    assert 0 < small < large
    faster = Network("Ring", 50.0, 500.0, per_type=(("ALL_REDUCE", 500.0, 500.0),))
    assert collective_ns(faster, pb.ALL_REDUCE, 1 << 24, 4) < large
    assert collective_ns(faster, pb.ALL_GATHER, 1 << 24, 4) == collective_ns(DEFAULT_NETWORK, pb.ALL_GATHER,
                                                                              1 << 24, 4)


def test_hops() -> None:
    assert [hops(DEFAULT_NETWORK, 0, d, 8) for d in (1, 4, 7)] == [1, 4, 1]
    assert hops(Network("Switch", 1.0, 1.0), 0, 5, 8) == 2
