"""`etweave simulate`: the replay engine, its rules, its outputs and its exit codes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import SCHEMA_VERSION, write_et
from etweave.simulate import RankGraph, SimNode, replay
from etweave.simulate.load import load_rank

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
INT32_ATTRS = {"comm_src", "comm_dst", "comm_tag"}


def attr(name: str, value: object) -> pb.AttributeProto:
    a = pb.AttributeProto(name=name)
    if isinstance(value, bool):
        a.bool_val = value
    elif isinstance(value, str):
        a.string_val = value
    elif name in INT32_ATTRS:
        a.int32_val = int(value)  # type: ignore[call-overload]
    else:
        a.int64_val = int(value)  # type: ignore[call-overload]
    return a


def node(nid: int, deps: tuple[int, ...] = (), dur: int = 0, start: int = 0, type: int = pb.COMP_NODE,
         name: str = "", **attrs: object) -> pb.Node:
    n = pb.Node(id=nid, name=name or f"n{nid}", type=type, data_deps=list(deps), start_time_micros=start,
                duration_micros=dur)
    n.attr.extend(attr(k, v) for k, v in attrs.items())
    return n


def write_rank(path: Path, nodes: list[pb.Node], rank: int | None = None) -> Path:
    meta = pb.GlobalMetadata(version=SCHEMA_VERSION)
    if rank is not None:
        meta.attr.append(attr("rank", rank))
    write_et(path, meta, nodes)
    return path


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from etweave.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


GPU = {"device": 0, "stream": 7}


def hand_checked_nodes() -> list[pb.Node]:
    """Expected (issue, end) in comments. Measured starts are the expected times + 1000, except node 6 (+4 us)."""
    return [
        node(1, type=pb.METADATA_NODE, name="root"),  # 0..0: metadata takes no resource and no time
        node(2, (1,), 5, 1000, tid=10),  # 0..5: ready at 0 with node 3; lower id first
        node(3, (1,), 3, 1005, tid=10),  # 5..8: waits for node 2 on thread 10
        node(4, (2,), 10, 1005, name="kernel", **GPU),  # 5..15 on the GPU stream
        node(5, (3, 4), 2, 1015, tid=10),  # 15..17: after both deps
        node(6, (2,), 4, 1009, tid=11),  # 5..9 on its own thread, alongside node 3 (measured 4 us late)
        node(12, (20,), 1, 1011, tid=12),  # 11..12: ready at 10, but node 21 was ready first (at 9)
        node(20, (1,), 10, 1000, tid=12),  # 0..10
        node(21, (6,), 1, 1010, tid=12),  # 10..11: ready at 9, issued when thread 12 frees at 10
    ]


EXPECTED = {1: (0, 0), 2: (0, 5), 3: (5, 8), 4: (5, 15), 5: (15, 17), 6: (5, 9), 12: (11, 12), 20: (0, 10),
            21: (10, 11)}


def test_hand_checked_graph_exact_times_and_serialization(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rank(tmp_path / "trace.0.et", hand_checked_nodes())
    rg = load_rank(path)
    result = replay([rg], {})
    got = {nd.id: (s, e) for nd, s, e in zip(rg.nodes, result.start[0], result.end[0], strict=True)}
    assert got == EXPECTED
    assert result.makespan == 17
    # two nodes ready together on thread 10 ran one after the other, never overlapping
    assert got[3][0] >= got[2][1]
    # critical path: root -> 2 -> kernel 4 -> 5, and its contributions add up to the makespan
    assert [rg.nodes[i].id for _, i in result.critical_path] == [1, 2, 4, 5]
    assert sum(result.contribution) == result.makespan

    rc, out, _ = run_cli(["simulate", str(path), "--json"], capsys)
    assert rc == 0
    summary = json.loads(out)
    assert summary["simulated_makespan_us"] == 17
    assert summary["measured_span_us"] == 17  # 1000 .. 1015 + 2
    assert summary["makespan_error_pct"] == 0.0
    err = summary["start_error"]
    assert err["count"] == 8  # the root has no measured start
    assert (err["p50_us"], err["max_us"]) == (0, 4)
    assert err["max_pct_of_span"] == pytest.approx(100 * 4 / 17, abs=1e-3)
    assert summary["critical_path"]["top"][0]["id"] == 4

    rc, out, _ = run_cli(["simulate", str(path)], capsys)
    assert rc == 0
    assert "makespan: simulated 17 us, measured span 17 us" in out
    assert "critical path: 4 nodes, 17 us" in out


def test_unmeasured_trace_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_rank(tmp_path / "plain.et", [node(1, dur=3, tid=1), node(2, (1,), 4, tid=1)])
    rc, out, _ = run_cli(["simulate", str(path)], capsys)
    assert rc == 0
    assert "simulated 7 us; no node has a measured start" in out


def two_rank_collective(tmp_path: Path, group: list[int]) -> tuple[Path, Path]:
    """Rank 0 reaches the all-reduce at 10, rank 1 (named by file only) at 30; transfer takes 5."""
    coll = {"pg_name": "0", "comm_type": pb.ALL_REDUCE, "is_cpu_op": False, **GPU}
    r0 = write_rank(tmp_path / "run.0.et", [
        node(1, (), 10, 100, **GPU),
        node(2, (1,), 25, 110, type=pb.COMM_COLL_NODE, name="allreduce", transfer_duration_micros=5, **coll),
        node(3, (2,), 1, 135, **GPU),
    ], rank=0)
    r1 = write_rank(tmp_path / "run.1.et", [
        node(1, (), 30, 100, **GPU),
        node(2, (1,), 5, 130, type=pb.COMM_COLL_NODE, name="allreduce", transfer_duration_micros=5, **coll),
        node(3, (2,), 1, 135, **GPU),
    ])
    (tmp_path / "comm_group.json").write_text(json.dumps({"0": group}))
    return r0, r1


def test_collective_waits_for_late_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r0, r1 = two_rank_collective(tmp_path, [0, 1])
    ranks = [load_rank(r0), load_rank(r1)]
    assert [rg.rank for rg in ranks] == [0, 1]  # attr on rank 0, file name on rank 1
    result = replay(ranks, {"0": [0, 1]})
    # the early rank issues its collective at 10 but it starts at the late rank's arrival, 30
    assert (result.issue[0][1], result.start[0][1], result.end[0][1]) == (10, 30, 35)
    assert (result.issue[1][1], result.start[1][1], result.end[1][1]) == (30, 30, 35)
    assert result.start[0][2] == 35 and result.makespan == 36
    # the path runs through the late rank's compute, not the early rank's wait
    assert [(ranks[ri].rank, ranks[ri].nodes[i].id) for ri, i in result.critical_path] == [(1, 1), (0, 2), (0, 3)]

    rc, out, _ = run_cli(["simulate", str(r0), str(r1), "--json"], capsys)
    assert rc == 0
    summary = json.loads(out)
    [coll] = summary["collectives"]["items"]
    assert (coll["pg"], coll["seq"], coll["ranks"]) == ("0", 0, [0, 1])
    assert (coll["simulated_start_us"], coll["measured_start_us"], coll["start_error_us"]) == (30, 30, 0)
    assert [(r["rank"], r["simulated_makespan_us"], r["measured_span_us"]) for r in summary["per_rank"]] == [
        (0, 36, 36), (1, 36, 36)]

    rc, _, err = run_cli(["simulate", str(r0), str(r0)], capsys)
    assert rc == 2 and "rank 0 given more than once" in err


def test_group_members_not_given_are_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r0, r1 = two_rank_collective(tmp_path, [0, 1, 2, 3])
    rc, out, _ = run_cli(["simulate", str(r0), str(r1)], capsys)
    assert rc == 0
    assert "pg '0': members [2, 3] are not among the files given: ignored" in out


def test_unknown_group_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r0, r1 = two_rank_collective(tmp_path, [0, 1])
    (tmp_path / "comm_group.json").unlink()
    rc, _, err = run_cli(["simulate", str(r0), str(r1)], capsys)
    assert rc == 2
    assert "pg_name '0'" in err and "--comm-group" in err
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"0": [0, 1]}))
    rc, _, _ = run_cli(["simulate", str(r0), str(r1), "--comm-group", str(groups)], capsys)
    assert rc == 0


def test_send_recv_pairing() -> None:
    c = pb.COMP_NODE
    r0 = RankGraph(0, [SimNode(1, "work", c, (), 5, "cpu:tid1"),
                       SimNode(2, "send", pb.COMM_SEND_NODE, (1,), 2, "cpu:tid1", comm_src=0, comm_dst=1, comm_tag=7)])
    r1 = RankGraph(1, [SimNode(1, "recv", pb.COMM_RECV_NODE, (), 1, "cpu:tid1", comm_src=0, comm_dst=1, comm_tag=7),
                       SimNode(2, "after", c, (1,), 3, "cpu:tid1")])
    result = replay([r0, r1], {})
    # the recv is issued at 0 but cannot end before the send's start (5) + its duration (2)
    assert (result.start[1][0], result.end[1][0]) == (0, 7)
    assert (result.start[1][1], result.end[1][1]) == (7, 10)
    assert result.makespan == 10 and not result.stuck_count
    # with rank 0 not given the recv runs alone on its own duration
    alone = replay([r1], {})
    assert alone.end[0][0] == 1 and any("peer rank outside" in note for note in alone.notes)


def test_deadlock_exits_3_quickly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    coll = {"pg_name": "", "comm_type": pb.ALL_REDUCE, **GPU}
    r0 = write_rank(tmp_path / "dl.0.et", [
        node(1, (), 5, **GPU),
        node(2, (1,), 5, type=pb.COMM_COLL_NODE, name="allreduce", **coll),
        node(3, (2,), 5, **GPU),
    ])
    r1 = write_rank(tmp_path / "dl.1.et", [node(1, (), 5, **GPU)])  # never issues the all-reduce
    began = time.monotonic()
    rc, out, err = run_cli(["simulate", str(r0), str(r1)], capsys)
    assert rc == 3
    assert time.monotonic() - began < 30  # a replay that waited on the clock would never return
    assert "deadlock: 2 nodes can never start" in err
    assert "rank 0 node 2 'allreduce': collective #0 of pg '' issued at 5 us" in err
    assert "rank 1, which never issues it (it has 0 collectives of that pg)" in err
    assert "rank 0 node 3 'n3': waits for 1 unfinished deps: 2" in err

    rc, out, _ = run_cli(["simulate", str(r0), str(r1), "--json"], capsys)
    assert rc == 3
    report = json.loads(out)["deadlock"]
    assert report["stuck_nodes"] == 2 and report["shown"][0]["id"] == 2


def test_deadlock_on_missing_send_and_on_cycle() -> None:
    r0 = RankGraph(0, [SimNode(1, "x", pb.COMP_NODE, (), 1, "cpu:tid1")])
    r1 = RankGraph(1, [SimNode(1, "recv", pb.COMM_RECV_NODE, (), 1, "cpu:tid1", comm_src=0, comm_dst=1, comm_tag=3),
                       SimNode(2, "y", pb.COMP_NODE, (), 1, "cpu:tid1"),  # ready, but the recv holds the thread
                       SimNode(3, "a", pb.COMP_NODE, (4,), 1),  # a cycle: 3 <-> 4
                       SimNode(4, "b", pb.COMP_NODE, (3,), 1)])
    result = replay([r0, r1], {})
    assert result.stuck_count == 4
    reasons = {s.node_id: s.waits_for for s in result.stuck}
    assert "rank 0 never sends it" in reasons[1]
    assert "waits for cpu:tid1, held by node 1" in reasons[2]
    assert reasons[3] == "waits for 1 unfinished deps: 4"
    assert [s.node_id for s in result.stuck][:2] == [1, 2]  # root causes first


def test_timeline_has_measured_and_simulated_tracks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r0, r1 = two_rank_collective(tmp_path, [0, 1])
    out_json = tmp_path / "out" / "timeline.json"
    out_json.parent.mkdir()
    rc, out, _ = run_cli(["simulate", str(r0), str(r1), "--timeline", str(out_json)], capsys)
    assert rc == 0 and f"wrote timeline {out_json}" in out
    trace = json.loads(out_json.read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert set(names.values()) == {"measured rank 0", "simulated rank 0", "measured rank 1", "simulated rank 1"}
    pid = {v: k for k, v in names.items()}
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] != 0]  # tid 0: the critical path
    sim0 = {e["args"]["id"]: e for e in slices if e["pid"] == pid["simulated rank 0"]}
    meas0 = {e["args"]["id"]: e for e in slices if e["pid"] == pid["measured rank 0"]}
    # simulated slices sit in the measured frame: origin (100) + issue; the collective shows its wait
    assert (sim0[2]["ts"], sim0[2]["dur"], sim0[2]["args"]["wait_us"]) == (110, 25, 20)
    assert (meas0[2]["ts"], meas0[2]["dur"]) == (110, 25)
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"gpu0:stream7", "critical path"}
    assert not list(out_json.parent.glob(".*tmp*"))  # the temporary file was renamed away


def test_plot_writes_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = write_rank(tmp_path / "trace.0.et", hand_checked_nodes())
    png = tmp_path / "cmp.png"
    rc, out, _ = run_cli(["simulate", str(path), "--plot", str(png)], capsys)
    assert rc == 0 and f"wrote plot {png}" in out
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_plot_without_matplotlib_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_rank(tmp_path / "trace.0.et", hand_checked_nodes())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    png = tmp_path / "cmp.png"
    rc, out, err = run_cli(["simulate", str(path), "--plot", str(png)], capsys)
    assert rc == 2
    assert err.strip().count("\n") == 0 and "pip install etweave[plot]" in err
    assert not png.exists() and out == ""


def test_replay_200k_node_chain_and_fan() -> None:
    n = 200_000
    chain_end = 100_000
    nodes = [SimNode(0, "root", pb.METADATA_NODE)]
    # a chain of unit kernels on one stream ...
    nodes += [SimNode(i, "k", pb.COMP_NODE, (i - 1,), 1, "gpu0:stream7") for i in range(1, chain_end + 1)]
    # ... and a fan of ops from the root over 8 threads, all ready at once, queueing on their threads
    nodes += [SimNode(i, "op", pb.COMP_NODE, (0,), 2, f"cpu:tid{i % 8}") for i in range(chain_end + 1, n)]
    result = replay([RankGraph(0, nodes)], {})
    assert result.stuck_count == 0
    assert result.makespan == chain_end  # the chain (100k us) outlasts each thread's 12.5k ops x 2 us
    assert len(result.critical_path) == chain_end + 1
    assert max(result.end[0][chain_end + 1:]) == 2 * -(-(n - chain_end - 1) // 8)


def test_convert_then_simulate_simple_add(tmp_path: Path, capsys: pytest.CaptureFixture[str], traces: Path) -> None:
    from etweave.convert import convert

    simple_add = traces / "gpu" / "simple-add"
    out = tmp_path / "simple-add.0.et"
    convert(simple_add / "host.json.gz", simple_add / "kineto.json.gz", out)
    capsys.readouterr()
    timeline = tmp_path / "timeline.json"
    rc, stdout, _ = run_cli(["simulate", str(out), "--json", "--timeline", str(timeline)], capsys)
    assert rc == 0
    summary = json.loads(stdout)
    assert summary["measured"] and summary["start_error"]["count"] > 0
    # one rank of host ops, runtime calls and kernels with measured exclusive durations: the replay should land
    # close to the measured span
    assert abs(summary["makespan_error_pct"]) < 5
    assert summary["critical_path"]["length_us"] == summary["simulated_makespan_us"]
    kinds = {e["args"]["name"].split(":")[0] for e in json.loads(timeline.read_text())["traceEvents"]
             if e["name"] == "thread_name"}
    assert {"cpu", "gpu0"} <= kinds  # both host threads and GPU streams were replayed as resources
