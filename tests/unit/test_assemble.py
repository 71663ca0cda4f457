"""assemble: items from a hand-built host ET and Kineto trace, with every field later stages read decoded once."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pytest import MonkeyPatch

import etweave.assemble
from etweave.assemble import assemble, kineto_args, op_record, sync_record
from etweave.conversion import Conversion, need
from etweave.convert import STAGES, run_stages
from etweave.model import HOST_OP, KERNEL, PROCESS_ROOT, RUNTIME, THREAD_ROOT, CommArgs, Graph, SyncRecord
from etweave.read.host_et import IO, HostOp, read_host_et
from etweave.read.kineto import Args, Event, read_kineto

PROCESS, THREAD = "[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]"
# A tensor in a host ET value: [tensor id, storage id, offset, elements, bytes per element, device]
X, Y = [10, 20, 0, 16, 4, "cuda:0"], [11, 21, 0, 16, 4, "cuda:0"]


def _node(node_id: int, name: str, parent: int, rf_id: int = 0, **io: object) -> dict[str, object]:
    return {"id": node_id, "name": name, "parent": parent, "tid": 1, "rf_id": rf_id, "seq_id": -1, **io}


HOST_NODES = [
    _node(1, PROCESS, 0),
    _node(2, THREAD, 1),
    _node(3, "aten::add", 2, rf_id=30, inputs=[X, X], input_types=["Tensor(float)", "Tensor(float)"],
          input_shapes=[[16], [16]], outputs=[Y], output_types=["Tensor(float)"], output_shapes=[[16]]),
    _node(4, "c10d::send", 2, rf_id=40, inputs=[[Y], 1, 9], input_types=["GenericList[Tensor(float)]", "Int", "Int"],
          input_shapes=[[[16]], [], []]),
]


def _cpu(name: str, ts: float, dur: float, rf_id: int) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 7, "ts": ts, "dur": dur,
            "args": {"Record function id": rf_id}}


KINETO_EVENTS = [
    _cpu("aten::add", 100, 20, 30),
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7, "ts": 105, "dur": 5,
     "args": {"correlation": "42"}},  # Kineto writes some numbers as strings
    {"ph": "X", "cat": "kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": 130, "dur": 8,
     "args": {"correlation": 42, "device": "0", "stream": "7"}},
    _cpu("c10d::send", 200, 10, 40),
    {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 1, "tid": 7, "ts": 210, "dur": 1,
     "args": {"correlation": "43", "cuda_sync_kind": "Stream Sync", "stream": "7", "device": 0}},
]


def _conversion(tmp_path: Path) -> Conversion:
    """A conversion of the hand-built traces, its stages before assemble run."""
    (tmp_path / "host.json").write_bytes(orjson.dumps({"schema": "1.0.1", "pid": 1, "nodes": HOST_NODES}))
    (tmp_path / "kineto.json").write_bytes(orjson.dumps({"traceEvents": KINETO_EVENTS}))
    host, kineto = read_host_et(tmp_path / "host.json"), read_kineto(tmp_path / "kineto.json")
    c = Conversion.start(host, kineto, 0, None, False)
    run_stages(c, [s for s in STAGES if s.name in ("link", "select_device_events", "repair_parents")])
    return c


def _graph(tmp_path: Path) -> Graph:
    return assemble(_conversion(tmp_path))


def test_inputs_handed_over_are_let_go_before_the_thread_sweeps(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    """The periods the sweeps make take the memory the events held: the inputs are let go once the items are
    made, before the sweeps, and the graph is the one made from inputs kept."""
    kept = _graph(tmp_path)
    c = _conversion(tmp_path)
    c.inputs_handed_over = True
    events = need(c.kineto, "kineto").events
    released_at_sweep = []
    sweep = etweave.assemble._thread_order

    def recording_sweep(g: Graph) -> None:
        released_at_sweep.append((c.ops, need(c.device, "device").gpu, need(c.repair, "repair").parent_of))
        with pytest.raises(RuntimeError, match="let go"):
            events[0]
        sweep(g)

    monkeypatch.setattr(etweave.assemble, "_thread_order", recording_sweep)
    g = assemble(c)
    assert released_at_sweep == [([], [], {})]
    assert g.items == kept.items and g.threads == kept.threads and g.streams == kept.streams


def test_items_carry_decoded_host_and_kineto_fields(tmp_path: Path) -> None:
    g = _graph(tmp_path)
    kinds = {it.id: it.kind for it in g.items if it.id <= 4}
    assert kinds == {1: PROCESS_ROOT, 2: THREAD_ROOT, 3: HOST_OP, 4: HOST_OP}
    add = g.by_id[3]
    assert add.measured and (add.start, add.dur, add.tid) == (100, 20, 7)
    assert add.host is not None and add.host.rf_id == 30 and add.host.et_parent == 2
    assert add.host.input_tensors == ((0, 10, 20, 16, 4), (1, 10, 20, 16, 4))
    assert add.host.output_tensors == ((0, 11, 21, 16, 4),)
    assert not add.host.collective_call and add.host.comm is None
    send = g.by_id[4].host
    assert send is not None and send.collective_call and send.comm == CommArgs(peer=1, tag=9)
    runtime = next(it for it in g.items if it.kind == RUNTIME)
    kernel = next(it for it in g.items if it.kind == KERNEL)
    assert runtime.correlation == 42 and runtime.id > 4  # device items take ids above the host's
    assert (kernel.device, kernel.stream, kernel.launcher) == (0, 7, runtime.id)
    assert runtime.enclosing == add.id  # time containment on its thread
    assert g.sync_events == [SyncRecord(correlation=43, kind="Stream Sync", device=0, stream=7,
                                 wait_on_stream=None, wait_on_event_corr=None)]


def test_thread_and_stream_order(tmp_path: Path) -> None:
    g = _graph(tmp_path)
    names = [g.by_id[i].name for i in g.threads[7]]
    # the add's own period, the launch inside it, its self time after the launch, idle, then the send
    assert names == [THREAD, "aten::add", "cudaLaunchKernel", "aten::add [self]", "[idle]", "c10d::send"]
    assert [g.by_id[i].name for i in g.streams[(0, 7)]] == ["add_kernel"]
    assert g.by_id[3].excl == 15  # 20 µs less the 5 µs launch inside it


def test_op_record_of_record_param_comms() -> None:
    io = IO(values=[[Y], 7, ["pg1"], "allreduce", 0, 0, 0, 0, 0, 0], shapes=[], types=[])
    op = HostOp(id=5, name="record_param_comms", parent=4, et_tid=1, rf_id=0, seq_id=-1, fw_parent=0, fw_tid=0,
                scope=0, op_schema="", inputs=io, outputs=IO([], [], []), extra={"pg_name": "pg0"})
    comm = op_record(op).comm
    # the attr first, then the positional name; the positional collective name (no attr) and sequence number
    assert comm == CommArgs(name="allreduce", pg_names=("pg0", "pg1"), seq=7, peer=7, tag=0)


def test_kineto_args_decoded_once() -> None:
    assert kineto_args(Args()) is None  # nothing later stages read: no record
    args = kineto_args(Args(collective_name="allreduce", in_nelems="16", dtype="Float", seq=3.0, pg_name="0",
                            input_dims=[[16]], input_type="not a list"))
    assert args is not None
    assert (args.collective_name, args.in_nelems, args.dtype, args.seq, args.pg_name) == \
        ("allreduce", 16, "Float", 3, "0")
    assert args.input_dims == [[16]] and args.input_type is None and args.collective_args
    unreadable = kineto_args(Args(in_nelems="many"))
    assert unreadable is not None and unreadable.in_nelems is None and unreadable.collective_args


def test_sync_record_defaults() -> None:
    ev = Event(cat="cuda_sync", args=Args(sync_kind="Event Sync", wait_on_stream="3", wait_on_event_corr="x"))
    assert sync_record(ev) == SyncRecord(correlation=None, kind="Event Sync", device=0, stream=None,
                                         wait_on_stream=3, wait_on_event_corr=None)
