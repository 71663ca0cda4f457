"""A real 2-rank gloo recording in which gloo ended a collective's record 1.8 ms after the thread waiting for it
resumed (docs/FACTS.md §W3, tests/data/gloo_record_tail): the collective ends where its waiter resumed, the rest of
its record is a `[record tail]` node of the worker's, the waiter's idle time is a wait for it (an edge, not a
duration), so the replay reproduces the run and a slower collective delays the waiter."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs, read_et
from etweave.cli import main
from etweave.report import unwaited_collectives
from etweave.simulate.engine import replay
from etweave.simulate.load import load_comm_group, load_rank

RUN = Path(__file__).resolve().parent / "data" / "gloo_record_tail"
ORDER = {"thread_order", "collective_order"}  # program and collective order: not a wait for the end


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tail") / "out"
    assert main(["convert-run", str(RUN), "-o", str(out), "-q", "--jobs", "1"]) == 0
    return out


def waiters(nodes: list[pb.Node], nid: int) -> list[int]:
    """The nodes on another thread than node `nid`'s that depend on it (or on a later period of its op) beyond
    program and collective order."""
    attrs = {n.id: node_attrs(n) for n in nodes}
    owner = {n.id: attrs[n.id].get("part_of", n.id) for n in nodes}
    tid = attrs[nid]["tid"]
    return [n.id for n in nodes if attrs[n.id].get("tid") != tid
            and any(owner[d] == nid and e not in ORDER
                    for d, e in zip(n.data_deps, attrs[n.id].get("dep_evidence", ()), strict=True))]


def the_tail(out: Path) -> tuple[list[pb.Node], pb.Node, pb.Node, pb.Node]:
    """Rank 1's nodes, its collective whose record outlasted it, that record's tail, and the wake-up after it."""
    (entry,) = orjson.loads((out / "report.json").read_bytes())["ranks"]["1"]["record_tails"]
    nodes = read_et(out / "trace.1.et")[1]
    by_id = {n.id: n for n in nodes}
    coll = by_id[entry["node"]]
    assert entry == {"node": coll.id, "name": "gloo:all_reduce",
                     "record_tail_micros": node_attrs(coll)["record_tail_micros"]}
    (tail,) = [n for n in nodes if coll.id in n.data_deps and n.name == "gloo:all_reduce [record tail]"]
    (wake,) = [by_id[w] for w in waiters(nodes, coll.id)]
    return nodes, coll, tail, wake


def test_the_collective_ends_where_its_waiter_resumed(converted: Path) -> None:
    reports = orjson.loads((converted / "report.json").read_bytes())["ranks"]
    assert reports["0"]["record_tails"] == [] and unwaited_collectives(reports["0"]) == []
    assert unwaited_collectives(reports["1"]) == [], "every collective a worker ran for another thread is waited for"
    nodes, coll, tail, wake = the_tail(converted)
    a, ta, wa = node_attrs(coll), node_attrs(tail), node_attrs(wake)
    assert a["record_tail_micros"] > 1000
    # the record as measured: the collective's time, then its tail on the worker's thread up to the record's end
    resumed = wake.start_time_micros
    assert tail.start_time_micros == resumed and tail.duration_micros == a["record_tail_micros"]
    assert ta["tid"] == a["tid"] and ta["part_of"] == coll.id
    assert abs(coll.start_time_micros + a["measured_duration_micros"] - (resumed + tail.duration_micros)) <= 1
    assert a["exclusive_micros"] == a["measured_duration_micros"], "its self time, the tail's included, as measured"
    # convert-run's transfer time runs from the latest member's start to the completion, not to the record's end
    assert coll.start_time_micros + coll.duration_micros <= resumed
    assert a["transfer_duration_micros"] == coll.duration_micros
    # the waiter: the issuing thread's wake-up, of no length, after the collective
    issuer = node_attrs(next(n for n in nodes if n.id == a["et_parent"]))
    assert wa["kind"] == "wakeup" and wa["tid"] == issuer["tid"] != a["tid"] and wake.duration_micros == 0
    assert dict(zip(wake.data_deps, wa["dep_evidence"], strict=True))[coll.id] == "thread_wait"


def test_the_replay_reproduces_it_and_a_slower_collective_delays_the_waiter(converted: Path) -> None:
    ranks = [load_rank(converted / f"trace.{r}.et") for r in (0, 1)]
    groups = load_comm_group(converted / "comm_group.json")
    _, coll, tail, wake = the_tail(converted)
    pos = {n.id: i for i, n in enumerate(ranks[1].nodes)}
    before = replay(ranks, groups)
    assert before.stuck_count == 0
    t0 = min(n.measured_start for rg in ranks for n in rg.nodes if n.measured_start > 0)
    # (the replay's clock starts at the run's first measured start)
    assert abs(before.start[1][pos[wake.id]] - (wake.start_time_micros - t0)) <= 250
    assert before.end[1][pos[coll.id]] <= before.start[1][pos[wake.id]]
    ranks[1].nodes[pos[coll.id]].duration += 5000
    after = replay(ranks, groups)
    assert after.start[1][pos[wake.id]] - before.start[1][pos[wake.id]] >= 5000 - 1
    assert after.start[1][pos[tail.id]] - before.start[1][pos[tail.id]] >= 5000 - 1


def test_the_summaries_say_it(converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = RUN / "rank1"
    capsys.readouterr()
    assert main(["convert", "--host", str(d / "host.json.gz"), "--device", str(d / "kineto.json.gz"),
                 "-o", str(tmp_path / "trace.1.et")]) == 0
    out = capsys.readouterr().out
    assert "  collectives whose record outlasted them (a waiter resumed first): 1, each cut at that resume" in out
    assert "nothing on another thread or stream waited for" not in out
