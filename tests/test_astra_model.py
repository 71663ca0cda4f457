"""`etweave simulate --model astra-sim`: ASTRA-sim's issue rules on hand-built graphs (times checked by hand), the
network formula, the CLI, and the calibration against what FORMATS.md 3b.2 measured on the real simulator."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import SCHEMA_VERSION, write_et
from etweave.cli import main
from etweave.simulate.astra import AstraNode, AstraRank, load_for_astra, measured_span_us, simulate
from etweave.simulate.network import DEFAULT_NETWORK, Network, collective_ns, load_network, send_ns

REPO = Path(__file__).resolve().parents[1]
F9 = REPO / "tests" / "data" / "f9eeab9"
CONFIGS = REPO.parent / "shared" / "astra-sim" / "configs"
BYTES_PER_NS_50 = 50 * 2**30 / 1e9  # 50 GB/s as ASTRA-sim converts it (GiB): 53.6870912 B/ns


def comp(nid: int, deps: tuple[int, ...] = (), us: int = 0, cpu: bool = True) -> AstraNode:
    return AstraNode(id=nid, name=f"n{nid}", type=pb.COMP_NODE, deps=deps, duration_us=us, is_cpu_op=cpu)


def coll(nid: int, deps: tuple[int, ...], comm_type: int, size: int, us: int = 0) -> AstraNode:
    return AstraNode(id=nid, name=f"c{nid}", type=pb.COMM_COLL_NODE, deps=deps, duration_us=us, is_cpu_op=False,
                     comm_type=comm_type, comm_size=size)


def p2p(nid: int, deps: tuple[int, ...], send: bool, src: int, dst: int, size: int, us: int = 0) -> AstraNode:
    return AstraNode(id=nid, name=f"p{nid}", type=pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, deps=deps,
                     duration_us=us, is_cpu_op=False, comm_size=size, comm_src=src, comm_dst=dst, comm_tag=7)


def ends(run_ranks: list[AstraRank], **kw: object) -> list[int | None]:
    return simulate(run_ranks, {}, **kw).finished_ns  # type: ignore[arg-type]


# --- issue rules, hand-checked -------------------------------------------------------------------------------


def test_one_cpu_slot_shared_by_threads_and_unlimited_variant() -> None:
    # two CPU nodes of different threads, both ready at 0: ASTRA-sim runs them one after the other (0..5, 5..8 µs);
    # a GPU node beside them has its own slot (0..4); with unlimited slots both CPU nodes start at 0
    rank = AstraRank(0, [comp(1, (), 5), comp(2, (), 3), comp(3, (), 4, cpu=False)])
    run = simulate([rank], {})
    assert run.finished_ns == [8000]
    assert run.slot_wait_ns[0] == [5000, 0, 0]  # node 2 waited 5 µs for the CPU slot
    assert run.blocked_by[0] == {(0, "COMP_NODE"): 5000}  # ... held by node 1, a COMP node without attr kind
    assert simulate([rank], {}, slots=False).finished_ns == [5000]


def test_slotless_kinds_what_if() -> None:
    # an [idle] delay node (6 µs) and real work of another thread (2 µs), both ready at 0: in ASTRA-sim the delay
    # holds the CPU slot and the work runs 6..8; with delays taking no slot (the bench's what-if) it runs 0..2
    idle = comp(1, (), 6)
    idle.kind = "delay"
    rank = AstraRank(0, [idle, comp(2, (), 2), comp(3, (2,), 1, cpu=False)])
    assert ends([rank]) == [9000]
    assert simulate([rank], {}, slotless_kinds=("delay",)).finished_ns == [6000]


def test_gpu_slot_shared_by_streams() -> None:
    rank = AstraRank(0, [comp(1, (), 2, cpu=False), comp(2, (), 3, cpu=False)])
    assert ends([rank]) == [5000]


def test_lowest_ready_id_first_not_first_ready() -> None:
    # node 5 holds the CPU slot 0..4 µs. Node 9 is ready at 0; node 6 becomes ready at 2 µs (after GPU node 2).
    # At 4 µs the lower id goes first: 6 runs 4..5, then 9 runs 5..6 and its GPU child 10 runs 6..11 µs.
    # (First-ready-first, the default model's rule, would run 9 at 4..5 and 10 at 5..10.)
    nodes = [comp(2, (), 2, cpu=False), comp(5, (), 4), comp(6, (2,), 1), comp(9, (), 1), comp(10, (9,), 5, cpu=False)]
    assert ends([AstraRank(0, nodes)]) == [11000]


def test_zero_duration_is_one_ns_and_metadata_reads_as_comp() -> None:
    root = AstraNode(id=1, name="root", type=pb.METADATA_NODE, deps=(), duration_us=0, is_cpu_op=True)
    nodes = [root, comp(2, (1,)), comp(3, (2,), cpu=False)]
    assert ends([AstraRank(0, nodes)]) == [3]  # three 1 ns nodes in a chain


def test_ring_all_reduce_formula_and_cross_rank_start() -> None:
    # 1 MiB all-reduce on 2 NPUs: 4 chunks of 262144 B, each 2(p-1) = 2 ring steps of 131072 B;
    # a step = 1 hop × 500 ns + 131072 / 53.6870912 B/ns + 10 ns endpoint delay = 2951.40625 ns
    step = 500 + 131072 / BYTES_PER_NS_50 + 10
    assert step == pytest.approx(2951.40625)
    expected = round(4 * 2 * step)  # 23611 ns
    assert collective_ns(DEFAULT_NETWORK, pb.ALL_REDUCE, 1 << 20, 2) == expected == 23611
    # rank 1 issues it after a 5 µs CPU node: both ranks start it then and end together;
    # rank 0's broadcast (higher id) waits for its comm slot, then lasts its own 2 µs
    r0 = AstraRank(0, [coll(1, (), pb.ALL_REDUCE, 1 << 20, us=99), coll(2, (), pb.BROADCAST, 0, us=2)])
    r1 = AstraRank(1, [comp(1, (), 5), coll(2, (1,), pb.ALL_REDUCE, 1 << 20, us=99)])
    run = simulate([r0, r1], {})
    assert run.finished_ns == [5000 + expected + 2000, 5000 + expected]
    assert run.slot_wait_ns[0][2] == 5000 + expected  # the broadcast's wait for the comm slot
    # the second run: the collective lasts each node's own duration (99 µs) from the common start
    assert simulate([r0, r1], {}, collectives="duration").finished_ns == [5000 + 99000 + 2000, 5000 + 99000]


def test_broadcast_replayed_from_duration_without_sync() -> None:
    r0 = AstraRank(0, [coll(1, (), pb.BROADCAST, 4096, us=7)])
    r1 = AstraRank(1, [comp(1, (), 5), coll(2, (1,), pb.BROADCAST, 4096, us=7)])
    assert ends([r0, r1]) == [7000, 12000]  # rank 0 does not wait for rank 1


def test_other_collective_formulas_by_hand() -> None:
    b = BYTES_PER_NS_50
    # reduce-scatter, 8 NPUs, 8 MiB: 4 chunks × 7 steps of chunk/8 = 262144 B
    assert collective_ns(DEFAULT_NETWORK, pb.REDUCE_SCATTER, 8 << 20, 8) == round(4 * 7 * (500 + 262144 / b + 10))
    # all-gather: comm_size is the per-rank input; 4 × 7 steps of the whole chunk (1 MiB / 4)
    assert collective_ns(DEFAULT_NETWORK, pb.ALL_GATHER, 1 << 20, 8) == round(4 * 7 * (500 + 262144 / b + 10))
    # all-to-all: p(p-1)/2 = 28 steps of chunk/8
    assert collective_ns(DEFAULT_NETWORK, pb.ALL_TO_ALL, 8 << 20, 8) == round(4 * 28 * (500 + 262144 / b + 10))
    # a switch: every step crosses 2 links; 400 GB/s
    switch = Network("Switch", 400.0, 936.25)
    assert collective_ns(switch, pb.ALL_REDUCE, 8 << 20, 8) == round(
        4 * 14 * (2 * 936.25 + 262144 / (400 * 2**30 / 1e9) + 10))
    assert collective_ns(DEFAULT_NETWORK, pb.ALL_REDUCE, 0, 8) == 0  # comm_size 0 is free (3b.4)


def test_send_recv_timed_by_the_network() -> None:
    # the send is issued at 3 µs; the recv (issued at 0, no slot) ends when the message arrived:
    # 3000 + 500 + 1000 / 53.687 B/ns = 3518.6 -> 3519 ns; the send ends then too
    assert send_ns(DEFAULT_NETWORK, 1000, 0, 1, 2) == round(500 + 1000 / BYTES_PER_NS_50) == 519
    r0 = AstraRank(0, [comp(1, (), 3), p2p(2, (1,), True, 0, 1, 1000)])
    r1 = AstraRank(1, [p2p(1, (), False, 0, 1, 1000)])
    assert ends([r0, r1]) == [3519, 3519]
    # an 8-NPU ring: rank 0 to rank 3 is 3 hops, to rank 6 two hops the other way round
    assert send_ns(DEFAULT_NETWORK, 1000, 0, 3, 8) == round(3 * 500 + 1000 / BYTES_PER_NS_50)
    assert send_ns(DEFAULT_NETWORK, 1000, 0, 6, 8) == round(2 * 500 + 1000 / BYTES_PER_NS_50)


def test_unsupported_collective_is_an_error() -> None:
    from etweave.simulate.engine import GraphError

    with pytest.raises(GraphError, match="Unsupported collective"):
        simulate([AstraRank(0, [coll(1, (), pb.REDUCE, 8)]), AstraRank(1, [coll(1, (), pb.REDUCE, 8)])], {})


def test_shared_configs_parse() -> None:
    ring = load_network(CONFIGS / "ring_8npus.yml")
    assert (ring.topology, ring.bandwidth_gbps, ring.latency_ns, ring.npus_count) == ("Ring", 50.0, 500.0, 8)
    switch = load_network(CONFIGS / "switch_2npus.yml")
    assert (switch.topology, switch.bandwidth_gbps, switch.latency_ns, switch.npus_count) == ("Switch", 400.0,
                                                                                               936.25, 2)


# --- CLI -------------------------------------------------------------------------------------------------------


def _attr(name: str, value: object) -> pb.AttributeProto:
    a = pb.AttributeProto(name=name)
    if isinstance(value, bool):
        a.bool_val = value
    else:
        a.int64_val = int(value)  # type: ignore[call-overload]
    return a


def _write(path: Path, rank: int, nodes: list[pb.Node]) -> Path:
    meta = pb.GlobalMetadata(version=SCHEMA_VERSION)
    meta.attr.append(_attr("rank", rank))
    write_et(path, meta, nodes)
    return path


def _node(nid: int, deps: tuple[int, ...], us: int, start: int, cpu: bool, tid: int) -> pb.Node:
    n = pb.Node(id=nid, name=f"n{nid}", type=pb.COMP_NODE, data_deps=list(deps), duration_micros=us,
                start_time_micros=start)
    n.attr.extend([_attr("is_cpu_op", cpu), _attr("tid", tid)])
    return n


def test_cli_prints_astra_sim_lines_and_replays_one_trace_as_two_npus(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # two threads that really ran at once (measured 1000..1010 and 1000..1006): the default model replays 10 µs,
    # ASTRA-sim's single CPU slot 16 µs
    f = _write(tmp_path / "trace.0.et", 0, [_node(1, (), 10, 1000, True, 1), _node(2, (), 6, 1000, True, 2)])
    assert main(["simulate", str(f), "--model", "astra-sim"]) == 0
    out = capsys.readouterr().out
    assert "sys[0] finished, 16000 cycles\nsys[1] finished, 16000 cycles" in out
    assert "= 1.600x the measured span (10 us)" in out
    assert main(["simulate", str(f), "--model", "astra-sim", "--unlimited-slots", "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["runs"]["network"]["finished_ns"] == {"0": 10000, "1": 10000}
    assert data["runs"]["network"]["ratio_to_measured"] == 1.0
    assert main(["simulate", str(f)]) == 0
    assert "makespan: simulated 10 us" in capsys.readouterr().out


def test_cli_bad_options_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _write(tmp_path / "trace.0.et", 0, [_node(1, (), 1, 1, True, 1)])
    bad = tmp_path / "net.yml"
    bad.write_text("topology: [ Torus ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n")
    for argv in (["--model", "astra-sim", "--network", str(bad)], ["--model", "astra-sim", "--npus", "1"],
                 ["--model", "astra-sim", "--npus", str((1 << 20) + 1)],  # past the largest world size read
                 ["--unlimited-slots"], ["--model", "astra-sim", "--timeline", str(tmp_path / "t.json")]):
        assert main(["simulate", str(f), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, argv


def test_cli_unsupported_collective_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reduce = pb.Node(id=1, name="reduce", type=pb.COMM_COLL_NODE, duration_micros=1)
    reduce.attr.extend([_attr("is_cpu_op", False), _attr("comm_type", pb.REDUCE), _attr("comm_size", 8)])
    f = _write(tmp_path / "trace.0.et", 0, [reduce])
    assert main(["simulate", str(f), "--model", "astra-sim"]) == 2
    err = capsys.readouterr().err
    assert err == (f"etweave: error: {f}: collective node 1 has comm_type 1, which ASTRA-sim does not run "
                   "(Unsupported collective comm type)\n")


def test_cli_deadlock_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a recv whose send never comes: the NPU never finishes, as in ASTRA-sim (no `finished` line for it)
    recv = pb.Node(id=1, name="recv", type=pb.COMM_RECV_NODE, duration_micros=1)
    recv.attr.extend([_attr("is_cpu_op", False), _attr("comm_size", 8)])
    recv.attr.extend(pb.AttributeProto(name=k, int32_val=v) for k, v in (("comm_src", 1), ("comm_dst", 0),
                                                                         ("comm_tag", 0)))
    f0 = _write(tmp_path / "trace.0.et", 0, [recv])
    f1 = _write(tmp_path / "trace.1.et", 1, [_node(1, (), 1, 1, True, 1)])
    assert main(["simulate", str(f0), str(f1), "--model", "astra-sim"]) == 3
    err = capsys.readouterr().err
    assert "sys[1] finished, 1000 cycles" in err and "sys[0]" not in err
    assert "1 nodes never finish" in err and "node 1 'recv'" in err
    assert main(["simulate", str(f0), str(f1), "--model", "astra-sim", "--json"]) == 3
    data = orjson.loads(capsys.readouterr().out)
    assert data["runs"]["network"]["finished_ns"] == {"0": None, "1": 1000}
    assert data["runs"]["network"]["stuck"] == ["rank 0 node 1 'recv': issued, waits for its peers"]


# --- calibration against the real simulator (FORMATS.md 3b.2) --------------------------------------------------


def _f9(name: str, tmp_path: Path) -> list[AstraRank]:
    """etweave's f9eeab9 output (METADATA_NODE roots), gunzipped; one trace replayed as 2 NPUs as 3b did."""
    out = tmp_path / name
    out.mkdir()
    files = []
    for gz in sorted((F9 / name).glob("*.et.gz")):
        files.append(out / gz.name[:-3])
        with gzip.open(gz) as src, files[-1].open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return load_for_astra(files)


# what ASTRA-sim gave (518bd513, analytical network, METADATA abort bypassed): makespan / measured span
MEASURED_RATIO = {"dlrm": 1.54, "gloo": 1.01, "resnet": 1.11}


@pytest.mark.parametrize("name", sorted(MEASURED_RATIO))
def test_calibration_matches_the_measured_simulator(name: str, tmp_path: Path) -> None:
    ranks = _f9(name, tmp_path)
    assert len(ranks) == {"dlrm": 8, "gloo": 2, "resnet": 2}[name]
    span = measured_span_us(ranks)
    assert span is not None
    run = simulate(ranks, {})  # the default network: ring, 50 GB/s, 500 ns
    ratio = run.makespan_ns / 1000 / span
    assert ratio == pytest.approx(MEASURED_RATIO[name], rel=0.02), ratio
    # the same files with unlimited slots: within 0.6% of the measured span (3b.2 gives one decimal)
    free = simulate(ranks, {}, slots=False).makespan_ns / 1000 / span
    assert round(abs(free - 1) * 100, 1) <= 0.6, free


def test_calibration_slot_waits_match_the_measured_simulator(tmp_path: Path) -> None:
    # 3b.2: CPU-slot waits summed to 3.9-4.7 ms per dlrm rank, 14.4 ms on rank 5, and 46.8 ms on resnet
    dlrm = simulate(_f9("dlrm", tmp_path), {})
    cpu_wait_ms = [w[0] / 1e6 for w in dlrm.slot_wait_ns]
    assert cpu_wait_ms[5] == pytest.approx(14.4, rel=0.02)
    assert all(3.85 <= w <= 4.75 for i, w in enumerate(cpu_wait_ms) if i != 5), cpu_wait_ms
    resnet = simulate(_f9("resnet", tmp_path), {})
    assert resnet.slot_wait_ns[0][0] / 1e6 == pytest.approx(46.8, rel=0.02)


def test_calibration_the_ring_config_not_the_switch_reproduces_dlrm(tmp_path: Path) -> None:
    # the network decides how far the unlimited-slot run lands from the measured span: the shared ring config
    # (50 GB/s, 500 ns) gives dlrm within 0.6% as ASTRA-sim did; the switch config (HGX-H100 values) does not
    ranks = _f9("dlrm", tmp_path)
    span = measured_span_us(ranks)
    assert span is not None
    for config, within in (("ring_8npus.yml", True), ("switch_8npus.yml", False)):
        free = simulate(ranks, {}, load_network(CONFIGS / config), slots=False).makespan_ns / 1000 / span
        assert (abs(free - 1) <= 0.006) is within, (config, free)


def test_one_trace_as_two_npus_runs_its_sends_and_recvs_alone(tmp_path: Path) -> None:
    # a rank-0 trace that sends to rank 1 and receives from it: replayed as NPUs 0 and 1 (both copies of rank 0),
    # no copy is the real peer, so each send/recv runs on its own time instead of waiting forever
    recv = AstraNode(id=3, name="recv", type=pb.COMM_RECV_NODE, deps=(2,), duration_us=4, is_cpu_op=False,
                     comm_size=8, comm_src=1, comm_dst=0, comm_tag=0)
    f = tmp_path / "trace.0.et"
    _write(f, 0, [_node(1, (), 1, 1, True, 1)])
    rank = load_for_astra([f])[0]
    rank.nodes += [p2p(2, (1,), True, 0, 1, 1000), recv]
    run = simulate([rank, AstraRank(1, rank.nodes, rank.source, replica=True)], {})
    assert run.stuck_count == 0
    assert run.finished_ns == [1000 + 519 + 4000] * 2  # CPU node, then the send's network time, then the recv's 4 µs
    assert "4 send/recv nodes have no peer among the NPUs given: replayed alone" in run.notes


def test_replicas_index_their_edges_once_as_copies_would() -> None:
    """A lone trace replayed as NPUs (`replicate`) shares one node list: its columns and edges are copied from the
    NPU before, moved to each NPU's indices, and equal what indexing separate copies of the nodes gives."""
    from etweave.simulate.astra import _flatten, replicate

    nodes = [comp(4, (1, 2), 3), comp(1, (), 2, cpu=False), comp(2, (1,), 1), coll(3, (1, 2), pb.ALL_REDUCE, 1 << 20),
             comp(5, (3, 4), 0), coll(6, (5,), pb.BROADCAST, 64)]  # out of id order: a file index
    shared = replicate(AstraRank(0, nodes), 3)
    apart = [AstraRank(r, list(nodes), replica=True) for r in range(3)]
    for contention in (True, False):
        flat = _flatten(shared, True, (), contention)
        assert flat == _flatten(apart, True, (), contention)
        assert flat.children[6:12] != flat.children[:6] and flat.file_index[2] == flat.file_index[0]
    assert simulate(shared, {}).finished_ns == simulate(apart, {}).finished_ns


def test_a_lone_trace_as_thousands_of_npus_reads_its_nodes_once(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Replicas share one node list: what reads the nodes (the measured span, the replay: `astra._mirrors`) reads
    it once, not once per NPU (`--npus 100000` on an 8-rank dlrm trace took 56 s, now under a second)."""
    from etweave.simulate.astra import replicate

    class Counted(list[AstraNode]):
        reads = 0

        def __iter__(self):  # type: ignore[no-untyped-def]
            Counted.reads += 1
            return super().__iter__()

    nodes = Counted([AstraNode(id=1, name="a", type=pb.COMP_NODE, deps=(), duration_us=3, is_cpu_op=True,
                               measured_start=100, measured_end=103)])
    npus = replicate(AstraRank(0, nodes), 5000)
    assert measured_span_us(npus) == 3
    assert Counted.reads <= 2  # its starts, then its ends
    run = simulate(npus, {})
    assert run.replicas_replayed and run.finished_ns == [3000] * 5000
    f = _write(tmp_path / "trace.0.et", 0, [_node(1, (), 10, 1000, True, 1)])
    assert main(["simulate", str(f), "--model", "astra-sim", "--npus", "5000"]) == 0
    out = capsys.readouterr().out
    assert out.count(" finished, 10000 cycles\n") == 5000  # (each NPU's line, of the network run)
