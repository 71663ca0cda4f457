"""`--comm-bandwidth` on hand-built graphs: a robust per-(process group, collective kind) fit of the graph's
transfers says how much of each transfer is bandwidth time; each edited node loses the part of it a faster network
saves, and keeps its latency and its own deviation from the fit (noise neither multiplied nor divided)."""

from __future__ import annotations

from pathlib import Path

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import write_et
from etweave.errors import BadInput
from etweave.simulate.engine import COLL, SEND, RankGraph, SimNode
from etweave.simulate.load import load_rank
from etweave.simulate.whatif import Transfer, apply, fit_transfers, parse_edit

MB = 1 << 20


def coll(nid: int, duration: int, pg: str = "") -> SimNode:
    return SimNode(nid, f"gloo:all_reduce#{nid}", COLL, (), duration, "cpu:tid1", pg=pg, kind="comm")


def graph(durations: list[int], pg: str = "") -> RankGraph:
    return RankGraph(0, [coll(i + 1, d, pg) for i, d in enumerate(durations)])


def all_reduce(sizes: list[int]) -> dict[int, Transfer]:
    return {i + 1: Transfer(pb.CollectiveCommType.Name(pb.ALL_REDUCE), size) for i, size in enumerate(sizes)}


def test_one_size_is_all_bandwidth_from_the_median() -> None:
    """Four transfers of one size, one of them twice as slow (noise): at half the bandwidth each takes the median's
    5100 us more, so the slow one's extra 4900 us stays 4900 us (its own time x 2 would double the noise)."""
    rank = graph([5000, 5200, 10000, 4800])
    [res] = apply([rank], [parse_edit("comm-bandwidth", "0.5")], [all_reduce([8 * MB] * 4)])
    assert [nd.duration for nd in rank.nodes] == [10100, 10300, 15100, 9900]
    assert res.before_us == 25000 and res.after_us == 45400 and res.unfitted == 0


def test_factor_one_changes_nothing() -> None:
    durations = [300, 310, 290, 5300, 5310, 5290, 9000]
    rank = graph(durations)
    apply([rank], [parse_edit("comm-bandwidth", "1")], [all_reduce([1024] * 3 + [8 * MB] * 4)])
    assert [nd.duration for nd in rank.nodes] == durations


def test_two_sizes_separate_latency_from_bandwidth() -> None:
    """1 KB transfers take ~300 us, 8 MB ones ~5300 us: latency ~300 us stays, only the bytes' time is divided."""
    durations = [300, 310, 290, 5300, 5310, 5290, 9000]  # the last 8 MB one is an outlier
    sizes = [1024] * 3 + [8 * MB] * 4
    fit = fit_transfers(list(zip(sizes, durations, strict=True)))
    assert fit.sizes == 2 and fit.samples == 7
    assert fit.latency_us == pytest.approx(300 - 1024 * fit.us_per_byte)
    assert fit.us_per_byte * (8 * MB - 1024) == pytest.approx(5005)
    rank = graph(durations)
    apply([rank], [parse_edit("comm-bandwidth", "2")], [all_reduce(sizes)])
    saved = 8 * MB * fit.us_per_byte / 2
    assert rank.nodes[0].duration == 300  # 1 KB: the latency, bandwidth hardly matters
    assert [nd.duration for nd in rank.nodes[3:]] == [round(d - saved) for d in durations[3:]]  # the outlier too


def test_groups_and_kinds_are_fitted_apart() -> None:
    """The same size in two process groups, one ten times slower: each group's bandwidth time is its own."""
    fast, slow = graph([1000, 1100, 900], pg="fast"), RankGraph(1, [coll(i + 1, d, "slow")
                                                                     for i, d in enumerate([10000, 11000, 9000])])
    sizes = all_reduce([MB] * 3)
    apply([fast, slow], [parse_edit("comm-bandwidth", "2")], [sizes, sizes])
    assert [nd.duration for nd in fast.nodes] == [500, 600, 400]  # half of its median, 1000 us, saved
    assert [nd.duration for nd in slow.nodes] == [5000, 6000, 4000]


def test_a_node_without_a_size_is_divided_by_the_factor() -> None:
    rank = graph([4000, 4400])
    rank.nodes.append(SimNode(3, "send", SEND, (), 700, None, comm_src=0, comm_dst=1, kind="comm"))
    transfers = {**all_reduce([MB, MB]), 3: Transfer("SEND", 0)}
    [res] = apply([rank], [parse_edit("comm-bandwidth", "2")], [transfers])
    assert [nd.duration for nd in rank.nodes] == [1900, 2300, 350]
    assert res.unfitted == 1


def test_selector_limits_what_is_edited_not_what_is_fitted() -> None:
    """`rank=1` edits rank 1's transfers only, with the fit over both ranks' transfers of the group."""
    r0 = graph([1000, 1000, 1000])
    r1 = RankGraph(1, [coll(1, 3000), coll(2, 1000), coll(3, 1000)])
    sizes = all_reduce([MB] * 3)
    apply([r0, r1], [parse_edit("comm-bandwidth", "rank=1:4")], [sizes, sizes])
    assert [nd.duration for nd in r0.nodes] == [1000] * 3
    assert [nd.duration for nd in r1.nodes] == [2250, 250, 250]  # 3/4 of the median's 1000 us saved


def test_plain_per_node_scale_is_scale_kind_comm() -> None:
    """The per-node form (each node's own time / F) is `--scale kind=comm:X`, X = 1/F."""
    rank = graph([5000, 10000])
    apply([rank], [parse_edit("scale", "kind=comm:0.5")], [all_reduce([MB, MB])])
    assert [nd.duration for nd in rank.nodes] == [2500, 5000]


def test_a_size_that_is_no_number_is_bad_input(tmp_path: Path) -> None:
    """The sizes are read from the rank's file: a comm_size that is a string is the user's bad input, named."""
    node = pb.Node(id=1, name="all_reduce", type=pb.COMM_COLL_NODE, duration_micros=100)
    node.attr.add(name="comm_type", int64_val=pb.ALL_REDUCE)
    node.attr.add(name="comm_size", string_val="abc")
    node.attr.add(name="is_cpu_op", bool_val=False)
    path = tmp_path / "trace.0.et"
    write_et(path, pb.GlobalMetadata(version="0.0.4"), [node])
    rank = load_rank(path)
    with pytest.raises(BadInput, match="attr comm_size is 'abc'"):
        apply([rank], [parse_edit("comm-bandwidth", "2")])
