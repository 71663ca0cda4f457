"""The pipeline on a hand-built rank: the stages run in order on one Conversion, every id comes from one
allocator, and the report is built from the Conversion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etweave.conversion import Conversion, need
from etweave.convert import STAGES, Result, Stage, run_pipeline, run_stages
from etweave.errors import BadInput, CheckFailed
from etweave.link import Selection
from etweave.model import DELAY, Ids, Item
from etweave.read.host_et import IO, PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, HostOp, HostTrace
from etweave.read.kineto import KinetoTrace, read_kineto
from etweave.report import Distribution, LinkSummary, LongDelay, Synthesized, reconciles

PID = 7


def op(op_id: int, name: str, parent: int, tid: int = 1, rf_id: int = 0) -> HostOp:
    return HostOp(id=op_id, name=name, parent=parent, et_tid=tid, rf_id=rf_id, seq_id=-1, fw_parent=0, fw_tid=0,
                  scope=0, op_schema="", inputs=IO([], [], []), outputs=IO([], [], []))


def host_trace(pid: int = PID) -> HostTrace:
    """A process root, a thread root, two linked ops (one with a missing parent) and one never measured."""
    return HostTrace(path="host.json", schema="1.1.0", pid=pid, ops=[
        op(1, PROCESS_ROOT_NAMES[0], 1, tid=0), op(2, THREAD_ROOT_NAMES[0], 1),
        op(10, "aten::linear", 2, rf_id=5), op(11, "aten::relu", 40, rf_id=6), op(12, "aten::unmeasured", 2)])


def event(cat: str, name: str, ts: float, dur: float, tid: int = 100, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kineto_trace(tmp_path: Path) -> KinetoTrace:
    events = [
        event("cpu_op", "aten::linear", 100, 50, **{"Record function id": 5}),
        event("cuda_runtime", "cudaLaunchKernel", 110, 5, correlation=1),
        event("cpu_op", "aten::addmm", 120, 10),  # no host op stands for it
        event("cpu_op", "aten::relu", 300, 20, **{"Record function id": 6}),
        event("kernel", "gemm", 130, 40, tid=7, correlation=1, device=0, stream=7),
        event("cpu_op", "outside", 900, 5),
    ]
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return read_kineto(path)


def test_the_stages_run_in_order_on_one_conversion(tmp_path: Path) -> None:
    assert [s.name for s in STAGES] == ["link", "select_device_events", "repair_parents", "build_graph",
                                        "mark_collectives", "infer_dependencies", "assign_roofline", "audit"]
    ran: list[str] = []

    def record(name: str) -> Stage:
        def run(c: Conversion) -> None:
            ran.append(f"{name} {c.rank}")
        return Stage(run, f"stage {name}")

    run_stages(Conversion.start(host_trace(), None, 3), [record("a"), record("b"), record("c")])
    assert ran == ["a 3", "b 3", "c 3"]


def test_each_stage_sets_its_field(tmp_path: Path) -> None:
    c = Conversion.start(host_trace(), kineto_trace(tmp_path))
    filled = []
    for s in STAGES:
        s.run(c)
        filled.append([name for name in ("link", "device", "repair", "graph", "collectives", "deps", "roofline",
                                         "report") if getattr(c, name) is not None])
    assert filled[0] == ["link"] and filled[1] == ["link", "device"]
    assert filled[-1] == ["link", "device", "repair", "graph", "collectives", "deps", "roofline", "report"]


def test_a_stage_out_of_order_is_refused(tmp_path: Path) -> None:
    c = Conversion.start(host_trace(), None)
    with pytest.raises(RuntimeError, match="no graph yet"):
        need(c.graph, "graph")


def test_every_id_comes_from_one_allocator(tmp_path: Path) -> None:
    host = host_trace()
    c = Conversion.start(host, kineto_trace(tmp_path))
    assert c.ids.peek() == 13  # above every host ET id
    run_stages(c)
    g = need(c.graph, "graph")
    ids = [it.id for it in g.items]
    assert len(ids) == len(set(ids)) == len(g.by_id)
    # the unlinked cpu op, the repair's missing-parent handling (none synthesized: the thread has a root), the
    # device items and the periods the later stages add all took theirs from the conversion's allocator
    assert [o.id for o in c.added_ops] == [13]
    assert sorted(i for i in ids if i >= 13) == list(range(13, c.ids.peek()))
    assert g.ids is c.ids
    added = g.add(Item(id=0, kind=DELAY, name="[idle]"))
    assert added.id == c.ids.peek() - 1 and g.by_id[added.id] is added
    assert [o.id for o in host.ops] == [1, 2, 10, 11, 12]  # the reader's trace is not changed


def test_the_report_is_built_from_the_conversion(tmp_path: Path) -> None:
    result = run_pipeline(host_trace(), kineto_trace(tmp_path))
    assert isinstance(result, Result)
    report = result.report
    assert report == result.audit.to_json()
    assert reconciles(report) == []
    assert report["host_ops"] == {"input": 5, "output": 5}
    assert report["cpu_ops"] == {"input": 4, "output": 3}  # linear, relu, and addmm made an op; "outside" left out
    assert report["synthesized"] == {"thread_roots": 0, "host_ops_from_kineto": 1}
    assert report["device_ops"] == {"input": 1, "output": 1}
    assert report["runtime_calls"] == {"input": 1, "output": 1}
    assert report["orphans"] == {"count": 1, "missing_parents": [
        {"id": 40, "thread": 1, "orphans": 1, "nodes_below": 1, "collectives": []}]}
    assert report["warnings"]["host_ops_unlinked"] == 1
    assert [lo["kind"] for lo in report["left_out"]] == ["cpu_ops"]
    assert report["link"]["method"] == "rf_id" and report["link"]["window_us"] == [100.0, 320.0]
    assert report["nodes"] == len(result.graph.items) == len(result.nodes)
    attrs = {a.name: a.WhichOneof("value") and getattr(a, a.WhichOneof("value")) for a in result.metadata.attr}
    assert (attrs["rank"], attrs["source_host"], attrs["source_device"]) == (0, "host.json", "kineto.json")


def test_kineto_only_counts_cpu_ops_not_host_ops(tmp_path: Path) -> None:
    result = run_pipeline(None, kineto_trace(tmp_path), rank=2)
    report = result.report
    assert report["rank"] == 2 and report["link"]["method"] == "kineto"
    assert report["host_ops"] == {"input": 0, "output": 0}
    assert report["synthesized"] == {"process_root": 1, "thread_roots": 1}
    assert report["cpu_ops"] == {"input": 4, "output": 4}
    assert reconciles(report) == []


def test_inputs_of_another_run_are_refused_or_reported(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed, match="not of the same run and rank"):
        run_pipeline(host_trace(pid=99), kineto_trace(tmp_path))
    report = run_pipeline(host_trace(pid=99), kineto_trace(tmp_path), allow_mismatch=True).report
    assert list(report["warnings"])[-1] == "inputs_mismatched"
    assert report["link"]["mismatch"] == [f"the host ET is of process 99, the Kineto cpu ops of process {PID}"]


def test_inputs_are_checked_before_any_stage(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="give a host ET"):
        Conversion.start(None, None)
    with pytest.raises(BadInput, match="give --device"):
        Conversion.start(host_trace(), None, selection=Selection(window=(0.0, 1.0)))
    c = Conversion.start(None, kineto_trace(tmp_path), selection=Selection(window=(250.0, 400.0)))
    assert (c.window, c.rank, c.ids.peek()) == ((250.0, 400.0), 0, 1)


def test_report_parts_write_todays_json() -> None:
    assert Distribution.of([]).to_json() == {"count": 0}
    assert Distribution.of([1, 2, 3, 10]).to_json() == {"count": 4, "total": 16, "p50": 3, "p90": 10, "max": 10}
    assert list(LongDelay(5, "[idle]", "delay", None, "12", 3, 200, "e").to_json()) == [
        "node", "name", "kind", "tid", "start_micros", "micros", "evidence"]
    assert LongDelay(5, "[gpu idle]", "delay", 7, None, 3, 200, "e").to_json()["stream"] == 7
    assert Synthesized(thread_roots=2, process_root=1).to_json() == {"process_root": 1, "thread_roots": 2}
    link = LinkSummary("alignment", 3, {"1": 100}, None, mismatch=["x"])
    assert list(link.to_json()) == ["method", "seq_offset", "threads", "window_us", "mismatch"]


def test_ids_hand_out_each_id_once() -> None:
    ids = Ids(4)
    assert [ids.next(), ids.next(), ids.peek(), ids.next()] == [4, 5, 6, 6]


@pytest.mark.parametrize("kineto_only", [False, True])
def test_inputs_handed_over_are_let_go_once_the_graph_is_built(tmp_path: Path, kineto_only: bool) -> None:
    """`release_inputs`: the same nodes and report, the Kineto events gone (their columns kept) and the ops too."""
    kept = run_pipeline(None if kineto_only else host_trace(), kineto_trace(tmp_path))
    kineto = kineto_trace(tmp_path)
    handed = run_pipeline(None if kineto_only else host_trace(), kineto, release_inputs=True)
    assert [n.SerializeToString() for n in handed.nodes] == [n.SerializeToString() for n in kept.nodes]
    assert handed.report == kept.report
    assert len(kineto.events) == 6 and list(kineto.events.cpu) == [0, 2, 3, 5]
    with pytest.raises(RuntimeError, match="let go"):
        kineto.events[0]
