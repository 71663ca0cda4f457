"""A real 2-rank gloo recording in which gloo ended a collective's record 1.8 ms after the thread waiting for it
resumed (docs/FACTS.md §W3, tests/data/gloo_record_tail): the audit names that collective with the idle node the
thread resumed from, and both summaries count it. The wait itself is not in the graph (the finders read the
record's end): `tests/test_collect.py` marks that gap."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs, read_et
from etweave.cli import main
from etweave.deps.evidence import MAX_WAKEUP
from etweave.report import UNWAITED, unwaited_collectives

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


def test_the_collective_whose_record_outlasted_its_waiter_is_named(converted: Path) -> None:
    reports = orjson.loads((converted / "report.json").read_bytes())["ranks"]
    assert unwaited_collectives(reports["0"]) == []
    (c,) = [c for c in reports["1"]["collectives_without_dependents"] if c["why"] in UNWAITED]
    assert c["why"] == "issuer_resumed_before_its_end" and c["name"] == "gloo:all_reduce"
    nodes = read_et(converted / "trace.1.et")[1]
    by_id = {n.id: n for n in nodes}
    coll, idle = by_id[c["node"]], by_id[c["resumed"]]
    a, ia = node_attrs(coll), node_attrs(idle)
    issuer = node_attrs(by_id[a["et_parent"]])
    # the issuing thread's idle time from the hand-over (as the worker took it up) ...
    assert ia["kind"] == "self_part" and ia["tid"] == issuer["tid"] != a["tid"]
    assert 0 <= idle.start_time_micros - coll.start_time_micros <= MAX_WAKEUP
    # ... ended while the record was open, 1.8 ms before its end
    record_end = coll.start_time_micros + a["measured_duration_micros"]
    resumed_at = idle.start_time_micros + idle.duration_micros
    assert abs(c["before_end_micros"] - (record_end - resumed_at)) <= 1 and c["before_end_micros"] > 1000
    assert waiters(nodes, coll.id) == []  # what the label says: nothing in the graph waits for its end
    # every other collective of the worker threads has a waiter on another thread (or ran on the issuing one)
    inline = {x["node"] for x in reports["1"]["collectives_without_dependents"] if x["why"] == "ran_on_issuing_thread"}
    others = [n.id for n in nodes if n.type == pb.COMM_COLL_NODE and n.id not in inline | {coll.id}]
    assert others and all(waiters(nodes, nid) for nid in others)


def test_the_summaries_count_it(converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["convert-run", str(RUN), "-o", str(tmp_path / "run"), "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.endswith(", 1 collective(s) nothing waited for") for line in lines if line.startswith("rank ")] \
        == [False, True]
    d = RUN / "rank1"
    assert main(["convert", "--host", str(d / "host.json.gz"), "--device", str(d / "kineto.json.gz"),
                 "-o", str(tmp_path / "trace.1.et")]) == 0
    node = next(c["node"] for c in orjson.loads((converted / "report.json").read_bytes())["ranks"]["1"]
                ["collectives_without_dependents"] if c["why"] in UNWAITED)
    assert f"  collectives nothing on another thread or stream waited for: 1 (nodes {node}; " \
        in capsys.readouterr().out
