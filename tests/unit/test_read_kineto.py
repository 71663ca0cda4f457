"""read/kineto.py: Kineto events decoded once into typed `Event`s, on small hand-built traces."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from etweave.errors import BadInput
from etweave.read.kineto import KinetoTrace, read_kineto
from tests.unit.build import host_trace, kineto_event, kineto_trace, write_json

EVENTS = [
    kineto_event("aten::mm", 100.0, 20.5, args={"External id": 7, "Record function id": 10, "Sequence number": 3}),
    kineto_event("cudaLaunchKernel", 105.0, 2.0, cat="cuda_runtime", args={"correlation": 55}),
    kineto_event("gemm", 108.0, 9.0, cat="kernel", tid=7, pid=0, args={"device": 0, "stream": 7, "correlation": 55}),
    kineto_event("process_name", 0.0, None, ph="M", cat="__metadata"),
]


def _read(tmp_path: Path, doc: object, gz: bool = False) -> KinetoTrace:
    return read_kineto(write_json(tmp_path / "kineto.json", doc, gz=gz))


@pytest.mark.parametrize("eager_bytes", ["", "0"])  # decoded once and kept, or re-decoded from raw JSON
def test_duration_events_and_their_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, eager_bytes: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    trace = _read(tmp_path, kineto_trace(EVENTS, rank=1, world_size=2), gz=True)
    assert [(e.name, e.cat, e.ts, e.dur) for e in trace.events] == [
        ("aten::mm", "cpu_op", 100.0, 20.5), ("cudaLaunchKernel", "cuda_runtime", 105.0, 2.0),
        ("gemm", "kernel", 108.0, 9.0)]  # the metadata event (ph "M") is not kept
    mm, launch, kernel = trace.events
    assert (mm.args.rf_id, mm.args.seq_number) == (10, 3)
    assert not hasattr(mm.args, "external_id")  # no stage reads it: not kept per event
    assert launch.args.correlation == kernel.args.correlation == 55
    assert (kernel.args.device, kernel.args.stream) == (0, 7)
    assert trace.rank == 1 and trace.warnings == {}


def test_bare_array_form(tmp_path: Path) -> None:
    assert [e.name for e in _read(tmp_path, EVENTS).events] == ["aten::mm", "cudaLaunchKernel", "gemm"]


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_missing_and_negative_durations_read_as_zero_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 eager_bytes: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    trace = _read(tmp_path, kineto_trace([kineto_event("a", 1.0, None), kineto_event("b", 2.0, -3.0),
                                          kineto_event("c", 3.0, 1.0)]))
    assert [e.dur for e in trace.events] == [0.0, 0.0, 1.0]
    assert list(trace.events.dur) == [0.0, 0.0, 1.0]
    assert trace.warnings == {"missing_durations": 1, "negative_durations": 1}


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_exact_duplicates_dropped_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              eager_bytes: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    ev = kineto_event("a", 1.0, 2.0)
    alike = {**kineto_event("a", 1.0, 2.0), "extra": 1}  # decodes as `ev` does, but is another text: kept
    trace = _read(tmp_path, kineto_trace([ev, kineto_event("b", 0.5, None), ev, alike, kineto_event("a", 1.0, 3.0),
                                          ev]))
    assert [(e.name, e.dur) for e in trace.events] == [("a", 2.0), ("b", 0.0), ("a", 2.0), ("a", 3.0)]
    assert list(trace.events.dur) == [2.0, 0.0, 2.0, 3.0] and list(trace.events.cpu) == [0, 1, 2, 3]
    assert trace.warnings == {"duplicate_kineto_events": 2, "missing_durations": 1}


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, eager_bytes: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    events = [*EVENTS, kineto_event("aten::add", 101.0, 1.0, tid="t2", args={
        "Sequence number": "12", "Record function id": str(1 << 70), "correlation": True, "Ev Idx": 4})]
    table = _read(tmp_path, kineto_trace(events)).events
    assert list(table.cpu) == [0, 3] and list(table.runtime) == [1] and list(table.gpu) == [2]
    assert table.name == ["aten::mm", "cudaLaunchKernel", "gemm", "aten::add"] and table.tid == [1, 1, 7, "t2"]
    assert list(table.correlation) == [-1, 55, 55, -1]  # a bool is no id
    assert list(table.seq) == [3, -1, -1, 12]  # a number written as a string is read as the number
    assert list(table.rf_id) == [10, 0, 0, (1 << 63) - 1]  # beyond 64 bits: present, at the bound
    assert list(table.ts) == [100.0, 105.0, 108.0, 101.0] and list(table.dur) == [20.5, 2.0, 9.0, 1.0]
    assert [table.entry_key(i) for i in (0, 3)] == [(100.0, -20.5, 0), (101.0, 4, 3)]


@pytest.mark.parametrize(("doc", "message"), [
    (host_trace([]), "looks like a host execution trace"),
    ({"foo": 1}, "no traceEvents"),
    ({"traceEvents": [{"ph": "X", "ts": "soon"}]}, r"traceEvents\[0\]"),
    (kineto_trace([kineto_event("a", 1e300, 1.0)]), r"traceEvents\[0\]\.ts"),
    (kineto_trace([kineto_event("a", 1.0, 1.0, args={"In msg nelems": -5})]), "is not an element count"),
    (kineto_trace([], rank=-1), "distributedInfo.rank"),
])
@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_bad_traces_are_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, eager_bytes: str, doc: object,
                                  message: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    with pytest.raises(BadInput, match=message):
        _read(tmp_path, doc)


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_the_first_bad_event_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, eager_bytes: str) -> None:
    """Whole-list checks find that something is wrong; the message names the first event in file order."""
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    good = [kineto_event("a", float(i), 1.0) for i in range(5)]
    bad_tid = kineto_event("b", 9.0, 1.0, tid=1 << 63)
    bad_nelems = kineto_event("c", 9.0, 1.0, args={"Out msg nelems": 1 << 50})
    undecodable = {"ph": "i", "ts": "soon"}  # not a duration event, but decoded (and refused) all the same
    for events, message in [
        ([*good, bad_nelems, bad_tid], r"traceEvents\[5\]\.args\.'Out msg nelems'"),
        ([*good, bad_tid, bad_nelems], r"traceEvents\[5\]\.tid"),
        ([*good, undecodable, bad_tid], r"\(in traceEvents\[5\]\)"),
        ([*good, kineto_event("d", 1.0, 1e300), undecodable], r"traceEvents\[5\]\.dur"),
    ]:
        with pytest.raises(BadInput, match=message):
            _read(tmp_path, kineto_trace(events))


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_events_of_any_phase_or_none_are_read_past(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   eager_bytes: str) -> None:
    """The whole-file decode knows the Chrome trace phases; an unknown phase, or none, is read by raw views."""
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    flow = {"ph": "s", "id": 3, "pid": 1, "tid": 1, "ts": 100.0, "cat": "ac2g", "name": "ac2g"}
    instant = {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 101.0,
               "args": {"Ev Idx": 9, "Bytes": 512, "Collective name": None}}
    for odd in ([], [{"ph": "Q", "ts": 1.0}], [{"name": "no phase"}]):
        trace = _read(tmp_path, kineto_trace([*EVENTS, flow, instant, *odd]))
        assert [e.name for e in trace.events] == ["aten::mm", "cudaLaunchKernel", "gemm"]


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_a_mistyped_field_of_another_phase_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        eager_bytes: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    for odd in ({"ph": "f", "name": 5}, {"ph": "i", "args": None}, {"ph": "M", "args": {"Process Group Name": 1}}):
        with pytest.raises(BadInput, match=r"not a Kineto trace: .*\(in traceEvents\[4\]\)"):
            _read(tmp_path, kineto_trace([*EVENTS, odd]))


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_released_events_keep_their_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            eager_bytes: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    table = _read(tmp_path, kineto_trace(EVENTS)).events
    table.release()
    assert len(table) == 3 and table.name == ["aten::mm", "cudaLaunchKernel", "gemm"] and list(table.gpu) == [2]
    for read in (lambda: table[1], lambda: list(table)):
        with pytest.raises(RuntimeError, match="let go"):
            read()


def test_released_events_keep_only_the_columns_asked_for(tmp_path: Path) -> None:
    table = _read(tmp_path, kineto_trace(EVENTS)).events
    table.release(keep=("cpu", "ts", "name"))
    assert list(table.cpu) == [0] and list(table.ts) == [100.0, 105.0, 108.0] and table.name[0] == "aten::mm"
    with pytest.raises(AttributeError):
        table.dur  # noqa: B018  # a column let go is not read as empty


@pytest.mark.parametrize("eager_bytes", ["", "0"])
def test_shared_strings_are_one_object_per_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 eager_bytes: str) -> None:
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", eager_bytes)
    events = [kineto_event("a" * 40, 100.0 + n, 1.0, tid=12345) for n in range(4)]
    table = _read(tmp_path, kineto_trace(events)).events
    table.share_strings()
    assert [e.name for e in table] == ["a" * 40] * 4 and [e.tid for e in table] == [12345] * 4
    if eager_bytes == "":  # decoded events: one object each, in the events and in the columns
        assert len({id(e.name) for e in table} | {id(n) for n in table.name}) == 1
        assert len({id(e.tid) for e in table} | {id(t) for t in table.tid}) == 1


def _everything(trace: KinetoTrace) -> tuple[object, ...]:
    """What reading gave: the events' fields, every column, the warnings."""
    table = trace.events
    events = [(e.cat, e.name, e.pid, e.tid, e.ts, e.dur, e.id, msgspec.structs.astuple(e.args)) for e in table]
    columns = [list(getattr(table, name)) for name in ("cpu", "runtime", "gpu", "sync", "ts", "dur", "tid", "name",
                                                       "correlation", "ev_idx", "seq", "rf_id")]
    return events, columns, trace.warnings


EDGE = (1 << 63) - 1
IN_RANGE = [  # every number at the edge of what the whole-file decode's types take
    kineto_event("a", -4.6e18, 1.0, tid=EDGE, pid=-EDGE - 1, args={
        "correlation": -EDGE - 1, "Ev Idx": EDGE, "Sequence number": 0, "Record function id": EDGE,
        "In msg nelems": 0, "Out msg nelems": (1 << 48) - 1}),
    kineto_event("b", 4.6e18, None, cat="cuda_runtime", tid="t", pid="p", args={"Ev Idx": -EDGE - 1}),
    kineto_event("c", 3.0, -2.0, cat="kernel", args={"correlation": 0, "Sequence number": -1}),
    kineto_event("c", 3.0, 4.6e18, cat="cuda_sync", args={"Record function id": -EDGE - 1, "Ev Idx": None}),
]
OUT_OF_TYPE = [  # each read by the raw views (and accepted: a column reads what it can)
    {"correlation": "12"}, {"correlation": True}, {"Ev Idx": 2.0}, {"Sequence number": 1 << 64},
    {"Record function id": -(1 << 70)}, {"In msg nelems": "7"}, {"Out msg nelems": 1 << 80},
]


@pytest.mark.parametrize("args", [None, *OUT_OF_TYPE])
def test_the_whole_file_decode_reads_as_the_raw_views(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      args: dict[str, object] | None) -> None:
    """Eagerly read, a trace whose numbers all fit the typed decode's types is read by it and needs no further
    check; one with any other is read by its raw views. Either reads as the lazy (raw) path does."""
    events = IN_RANGE if args is None else [*IN_RANGE, kineto_event("d", 5.0, 1.0, args=args)]
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps(kineto_trace(events)))  # (orjson writes no int beyond 64 bits)
    monkeypatch.setenv("ETWEAVE_EAGER_BYTES", "0")
    lazy = read_kineto(path)
    monkeypatch.delenv("ETWEAVE_EAGER_BYTES")
    eager = read_kineto(path)
    assert _everything(eager) == _everything(lazy)
    assert all(type(e).__name__ == "_Duration" for e in eager.events) == (args is None)
    assert eager.warnings == {"missing_durations": 1, "negative_durations": 1}
