"""`simulate --timeline`: one slice per op, nested as the host call stack nests, never partly overlapping on a
track (Perfetto cannot draw that); the critical path marked and drawn as flow arrows."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import PAIRS, convert_pair

from etweave.chakra.io import node_attrs, write_et
from etweave.cli import main


def partial_overlaps(slices: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of slices on one track that overlap without one containing the other."""
    bad = []
    stack: list[dict] = []
    for s in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= s["ts"]:
            stack.pop()
        if stack and s["ts"] + s["dur"] > stack[-1]["ts"] + stack[-1]["dur"]:
            bad.append((stack[-1], s))
        stack.append(s)
    return bad


def max_depth(slices: list[dict]) -> int:
    deepest, stack = 0, []
    for s in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1] <= s["ts"]:
            stack.pop()
        stack.append(s["ts"] + s["dur"])
        deepest = max(deepest, len(stack))
    return deepest


@pytest.mark.parametrize("rel", PAIRS)
def test_timeline_nests_every_shared_pair(traces: Path, rel: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    result = convert_pair(traces, rel)
    path = tmp_path / f"trace.{result.graph.rank}.et"  # a file's name gives its rank (etweave.runfolder)
    write_et(path, result.metadata, result.nodes)
    timeline = tmp_path / "t.json"
    assert main(["simulate", str(path), "--timeline", str(timeline)]) == 0
    capsys.readouterr()
    events = json.loads(timeline.read_text())["traceEvents"]
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    for key, slices in tracks.items():
        assert partial_overlaps(slices) == [], key
    names = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert not [n for n in names if "overlap" in n]  # nesting came from the ops, not from extra tracks
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    rank = result.graph.rank
    assert sorted(processes.values()) == [f"measured rank {rank}", f"simulated rank {rank}"]

    # one slice per op: parts (`[self]`, `[resumed]`) are merged into their op's slice, per view
    nodes = {n.id: node_attrs(n) for n in result.nodes}
    parts = {i for i, a in nodes.items() if "part_of" in a}
    for pid in processes:
        ids = [e["args"]["id"] for (p, tid), sl in tracks.items() if p == pid and not is_critical(events, p, tid)
               for e in sl]
        assert len(ids) == len(set(ids)) and not parts & set(ids)
        merged = [e for (p, _), sl in tracks.items() if p == pid for e in sl if e["args"].get("parts")]
        if parts:
            assert merged and all(set(e["args"]["parts"]) <= parts for e in merged)
    # the call stack shows: host ops hold their children on the thread's track
    cpu_tracks = [sl for (p, tid), sl in tracks.items() if thread_name(events, p, tid).startswith("cpu")]
    assert max(max_depth(sl) for sl in cpu_tracks) >= 4  # flat periods, as before, never went past 2
    # args: id, kind, evidence of each dep
    some = next(e for sl in tracks.values() for e in sl if e["args"].get("evidence"))
    assert some["args"]["kind"] and all(len(x.split()) == 2 for x in some["args"]["evidence"])


def thread_name(events: list[dict], pid: int, tid: int) -> str:
    return next(e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == pid
                and e["tid"] == tid)


def is_critical(events: list[dict], pid: int, tid: int) -> bool:
    return thread_name(events, pid, tid) == "critical path"


def test_critical_path_marked_with_flows(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["convert-run", str(traces / "cpu-gloo/dist_ddp_w2"), "-o", str(out), "--jobs", "1",
                 "--quiet"]) == 0
    timeline = tmp_path / "t.json"
    assert main(["simulate", str(out), "--json", "--timeline", str(timeline)]) == 0
    summary = json.loads(capsys.readouterr().out)
    events = json.loads(timeline.read_text())["traceEvents"]
    critical = [e for e in events if e["ph"] == "X" and is_critical(events, e["pid"], e["tid"])]
    assert len(critical) == summary["critical_path"]["nodes"]
    assert sum(e["dur"] for e in critical) == summary["critical_path"]["length_us"]
    flows = [e for e in events if e["ph"] in ("s", "f")]
    starts = {e["id"] for e in flows if e["ph"] == "s"}
    assert starts and starts == {e["id"] for e in flows if e["ph"] == "f"}
    # each arrow end lies inside a slice marked as on the critical path, on the same track
    marked = [e for e in events if e["ph"] == "X" and "critical_path_us" in e["args"]
              and not is_critical(events, e["pid"], e["tid"])]
    for f in flows:
        assert any(m["pid"] == f["pid"] and m["tid"] == f["tid"] and m["ts"] <= f["ts"] <= m["ts"] + m["dur"]
                   for m in marked)
    # the path crosses ranks: some arrow goes from one process to another
    by_id = defaultdict(list)
    for f in flows:
        by_id[f["id"]].append(f["pid"])
    assert any(len(set(p)) == 2 for p in by_id.values())
    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {"measured rank 0", "simulated rank 0", "measured rank 1", "simulated rank 1"}


def test_dep_evidence_names_every_data_dep(traces: Path, tmp_path: Path) -> None:
    """attr dep_evidence holds one evidence source per data_dep, also after convert-run adds rank start offsets."""
    out = tmp_path / "run"
    assert main(["convert-run", str(traces / "gpu/dlrm-8rank"), "-o", str(out), "--jobs", "1", "--quiet"]) == 0
    from etweave.chakra.io import read_et

    seen: set[str] = set()
    for path in sorted(out.glob("*.et")):
        for node in read_et(path)[1]:
            evidence = node_attrs(node).get("dep_evidence") or []
            assert len(evidence) == len(node.data_deps), (path.name, node.id, node.name)
            seen.update(evidence)
    assert {"thread_order", "launch", "stream_order", "rank_start_offset"} <= seen
