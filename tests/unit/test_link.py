"""The link stage on hand-built traces: host ops to Kineto cpu events, Kineto cpu ops as host ops, the device
window and the --steps / --window selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etweave.errors import BadInput
from etweave.link import (
    HostLink,
    Selection,
    add_unlinked_cpu_ops,
    kineto_host,
    link_host,
    mismatch_evidence,
    restrict,
    select_device,
)
from etweave.model import Ids
from etweave.read.host_et import IO, PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, HostOp, HostTrace
from etweave.read.kineto import KinetoTrace, read_kineto

PID = 7


def op(op_id: int, name: str, parent: int, tid: int = 1, rf_id: int = 0, seq_id: int = -1) -> HostOp:
    return HostOp(id=op_id, name=name, parent=parent, et_tid=tid, rf_id=rf_id, seq_id=seq_id, fw_parent=0,
                  fw_tid=0, scope=0, op_schema="", inputs=IO([], [], []), outputs=IO([], [], []))


def host_trace(*ops: HostOp, pid: int = PID) -> HostTrace:
    roots = [op(1, PROCESS_ROOT_NAMES[0], 1, tid=0), op(2, THREAD_ROOT_NAMES[0], 1)]
    return HostTrace(path="host.json", schema="1.1.0", pid=pid, ops=sorted([*roots, *ops], key=lambda o: o.id))


def cpu(name: str, ts: float, dur: float, args: dict[str, Any] | None = None, tid: int = 100) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def kineto(tmp_path: Path, *events: dict[str, Any]) -> KinetoTrace:
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps({"traceEvents": list(events)}))
    return read_kineto(path)


def test_links_by_record_function_id_and_measures_the_window(tmp_path: Path) -> None:
    host = host_trace(op(10, "aten::add", 2, rf_id=5), op(11, "aten::mul", 2, rf_id=6))
    k = kineto(tmp_path, cpu("aten::add", 100, 10, {"Record function id": 5}),
               cpu("aten::mul", 120, 30, {"Record function id": 6}))
    link = link_host(host, k)
    assert link.method == "rf_id"
    assert link.event_of == {10: 0, 11: 1}
    assert link.kthread_of == {1: 100}
    assert link.window == (100, 150)


def test_a_record_function_id_that_names_another_op_is_not_linked_but_counted(tmp_path: Path) -> None:
    host = host_trace(op(10, "aten::add", 2, rf_id=5))
    k = kineto(tmp_path, cpu("aten::mul", 100, 10, {"Record function id": 5}))
    link = link_host(host, k)
    assert link.event_of == {}
    assert link.warnings == {"rf_id_name_mismatch": 1}
    assert mismatch_evidence(host, k, link) == [
        "the Record function ids of 1 host ops name other ops in the Kineto trace"]


def test_without_record_function_ids_the_thread_sequences_are_aligned(tmp_path: Path) -> None:
    host = host_trace(op(10, "aten::add", 2, seq_id=3), op(11, "aten::mul", 2, seq_id=4))
    k = kineto(tmp_path, cpu("other", 10, 5, tid=200),
               cpu("aten::add", 100, 10, {"Sequence number": 3}), cpu("aten::mul", 120, 10, {"Sequence number": 4}))
    link = link_host(host, k)
    assert link.method == "alignment"
    assert link.event_of == {10: 1, 11: 2}
    assert link.kthread_of == {1: 100}


def test_another_process_is_evidence_of_a_mismatch(tmp_path: Path) -> None:
    host = host_trace(op(10, "aten::add", 2, rf_id=5), pid=99)
    k = kineto(tmp_path, cpu("aten::add", 100, 10, {"Record function id": 5}))
    assert mismatch_evidence(host, k, link_host(host, k)) == [
        f"the host ET is of process 99, the Kineto cpu ops of process {PID}"]


def test_unlinked_cpu_ops_become_ops_of_their_own_and_the_host_trace_is_unchanged(tmp_path: Path) -> None:
    host = host_trace(op(10, "aten::linear", 2, rf_id=5))
    k = kineto(tmp_path, cpu("aten::linear", 100, 50, {"Record function id": 5}),
               cpu("aten::addmm", 110, 20, {"Input Dims": [[2, 3]], "Input type": ["float"]}),
               cpu("outside", 500, 5))
    link = link_host(host, k)
    ids = Ids(11)
    added = add_unlinked_cpu_ops(host, k, link, ids)
    assert [(o.id, o.name, o.parent, o.et_tid) for o in added] == [(11, "aten::addmm", 10, 1)]
    assert added[0].inputs.shapes == [[2, 3]] and added[0].inputs.types == ["float"]
    assert link.event_of[11] == 1  # linked to its own event
    assert ids.peek() == 12  # its id came from the one allocator
    assert [o.id for o in host.ops] == [1, 2, 10]  # the reader's ops are not appended to


def test_kineto_only_ops_take_ids_from_the_allocator_in_entry_order(tmp_path: Path) -> None:
    k = kineto(tmp_path, cpu("inner", 105, 10), cpu("outer", 100, 50), cpu("other thread", 101, 1, tid=300),
               cpu("straddles", 140, 30))
    ids = Ids(1)
    ops, link = kineto_host(k, None, ids)
    assert [(o.id, o.name, o.parent, o.et_tid) for o in ops] == [
        (1, PROCESS_ROOT_NAMES[0], 1, 0), (2, THREAD_ROOT_NAMES[0], 1, 100), (3, THREAD_ROOT_NAMES[0], 1, 300),
        (4, "outer", 2, 100), (5, "other thread", 3, 300), (6, "inner", 4, 100), (7, "straddles", 2, 100)]
    assert ids.peek() == 8
    assert link.method == "kineto" and link.event_of == {4: 1, 5: 2, 6: 0, 7: 3}
    assert link.warnings == {"kineto_cpu_ops_partly_overlapping": 1}  # "straddles" ends after "outer"


@pytest.mark.parametrize("with_index", [True, False])
def test_kineto_only_entry_order_at_equal_starts(tmp_path: Path, with_index: bool) -> None:
    """Within a thread, ops entered at one µs are ordered by Kineto's event index where every op has one (sorted
    in C), else outer (longer) first (a key per op); the file's order is not the entry order here."""
    def index(n: int) -> dict[str, Any]:
        return {"Ev Idx": n} if with_index else {}
    k = kineto(tmp_path, cpu("inner", 100, 5, index(2)), cpu("outer", 100, 10, index(1)), cpu("first", 90, 1, index(0)),
               cpu("other thread", 100, 1, tid=300), cpu("last", 120, 1, index(3)))
    ops, link = kineto_host(k, None, Ids(1))
    assert [(o.id, o.name, o.parent) for o in ops[3:]] == [
        (4, "first", 2), (5, "outer", 2), (6, "inner", 5), (7, "other thread", 3), (8, "last", 2)]
    assert link.event_of == {4: 2, 5: 1, 6: 0, 7: 3, 8: 4} and link.warnings == {}


def test_kineto_only_keeps_the_ops_that_start_in_the_window(tmp_path: Path) -> None:
    k = kineto(tmp_path, cpu("early", 10, 5), cpu("kept", 100, 5), cpu("late", 300, 5))
    ops, link = kineto_host(k, (50.0, 200.0), Ids(1))
    assert [o.name for o in ops[2:]] == ["kept"]
    assert link.window == (50.0, 200.0)


def test_device_events_belong_to_the_window_of_their_launch(tmp_path: Path) -> None:
    def runtime(ts: float, corr: int) -> dict[str, Any]:
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": 100, "ts": ts,
                "dur": 2, "args": {"correlation": corr}}

    def kernel(ts: float, corr: int) -> dict[str, Any]:
        return {"ph": "X", "cat": "kernel", "name": f"k{corr}", "pid": 0, "tid": 7, "ts": ts, "dur": 5,
                "args": {"correlation": corr, "device": 0, "stream": 7}}

    k = kineto(tmp_path, runtime(100, 1), kernel(110, 1), runtime(500, 2), kernel(510, 2))
    sel = select_device(k, (90.0, 200.0))
    assert (sel.runtime, sel.gpu, sel.launcher_of) == ([0], [1], {1: 0})
    assert (sel.gpu_input, sel.runtime_input) == (2, 2)
    left = {key: (lo.count, lo.examples) for key, lo in sel.left_out.items()}
    assert left == {("device_ops", "outside_window"): (1, ["k2 @ 510.0"]),
                    ("runtime_calls", "outside_window"): (1, ["cudaLaunchKernel @ 500.0"])}


def test_selection_of_steps_and_windows(tmp_path: Path) -> None:
    assert Selection.parse() is None
    assert Selection.parse(steps="3") == Selection(steps=(3, 3))
    assert Selection.parse(window="10:") == Selection(window=(10.0, float("inf")))
    with pytest.raises(BadInput, match="first step 5 is after last step 4"):
        Selection.parse(steps="5:4")
    with pytest.raises(BadInput, match="not both"):
        Selection.parse(steps="1", window="1:2")
    k = kineto(tmp_path, cpu("ProfilerStep#4", 100, 50), cpu("ProfilerStep#5", 150, 60), cpu("x", 160, 1))
    assert Selection(steps=(4, 5)).resolve(k) == (100, 210)
    with pytest.raises(BadInput, match="ProfilerStep#9 is not in the trace"):
        Selection(steps=(9, 9)).resolve(k)
    assert restrict((100.0, 200.0), (150.0, 300.0)) == (150.0, 200.0)
    assert restrict(None, (1.0, 2.0)) == (1.0, 2.0)
    with pytest.raises(BadInput, match="does not overlap"):
        restrict((100.0, 200.0), (300.0, 400.0))


def test_no_kineto_trace_links_nothing() -> None:
    assert link_host(host_trace(op(10, "a", 2)), None) == HostLink("none", {}, {})


def _best_offset_scoring_all(ops: list[HostOp], seqs: list[int], names: list[str]) -> int | None:
    """`_seq_offset`'s choice by its definition: every offset the first 64 host pairs suggest, each scored in full
    (host pairs whose number plus the offset is a Kineto number of their name), the best score, then the smallest
    offset in size, then the negative one."""
    kineto = {(n, s) for n, s in zip(names, seqs, strict=True) if s >= 0}
    pairs = [(o.name, o.seq_id) for o in ops if o.seq_id >= 0]
    offsets = {ks - s for name, s in pairs[:64] for n, ks in kineto if n == name}
    if not pairs or not kineto or not offsets:
        return None
    return -max((sum((n, s + d) in kineto for n, s in pairs), -abs(d), -d) for d in offsets)[2]


def test_sequence_offset_is_the_best_scoring_candidate() -> None:
    from random import Random

    from etweave.link.host import _seq_offset
    from etweave.read.kineto import EventTable
    rng = Random(15)
    for _ in range(300):
        n = rng.randint(1, 40)
        seqs = [rng.choice([-1, *range(12)]) for _ in range(n)]
        names = [rng.choice("abc") for _ in range(n)]
        table = EventTable()
        table.seq.fromlist(seqs)
        table.name += names
        ops = [op(10 + j, rng.choice("abcd"), 2, seq_id=rng.choice([-1, *range(12)]))
               for j in range(rng.randint(1, 100))]
        assert _seq_offset(ops, table, {100: list(range(n))}) == _best_offset_scoring_all(ops, seqs, names)


def test_sequence_offset_zero_when_it_matches_every_pair() -> None:
    """Offset 0 is taken at once when every host pair's number is a Kineto number of its name (no offset scores
    more, none is smaller); otherwise the offsets are scored."""
    from etweave.link.host import _seq_offset
    from etweave.read.kineto import EventTable

    def offset(seqs: list[int], names: str, host: list[tuple[str, int]]) -> int | None:
        table = EventTable()
        table.seq.fromlist(seqs)
        table.name += list(names)
        ops = [op(10 + j, name, 2, seq_id=s) for j, (name, s) in enumerate(host)]
        return _seq_offset(ops, table, {100: list(range(len(seqs)))})

    kineto = ([1, 2, 3, 6, 7, 8], "abaaba")
    assert offset(*kineto, [("a", 1), ("b", 2), ("a", -1), ("a", 3)]) == 0  # 5 matches all too: 0 is smaller
    assert offset(*kineto, [("a", 1), ("b", 2), ("a", 3), ("b", 4)]) == 0  # 0 and 5 match 3 of 4: scored, 0 wins
    assert offset([6, 7, 8], "aba", [("a", 1), ("b", 2), ("a", 3)]) == 5
    assert offset([6, 7, 8], "aba", [("c", 1)]) is None
