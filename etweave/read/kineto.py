"""Kineto (Chrome trace JSON) reader. msgspec decodes only the fields etweave uses into typed structs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from etweave.errors import BadInput
from etweave.read.source import read_bytes

CPU_OP_CATS = frozenset({"cpu_op", "user_annotation"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
SYNC_CAT = "cuda_sync"


# gc=False: events hold no reference cycles, and tracking millions of them made the collector the largest cost.
class Args(msgspec.Struct, frozen=True, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    rf_id: Any = msgspec.field(default=None, name="Record function id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    seq_number: Any = msgspec.field(default=None, name="Sequence number")
    fwd_thread: Any = msgspec.field(default=None, name="Fwd thread id")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    bytes: Any = None
    wait_on_stream: Any = None
    wait_on_event_corr: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")
    ev_idx: Any = msgspec.field(default=None, name="Ev Idx")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")


_NO_ARGS = Args()


_INT64 = 1 << 63


def as_int(value: Any, default: int | None = None) -> int | None:
    """Kineto writes some ids as numbers in one version and strings in another."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -_INT64 <= value < _INT64 else default  # nothing real is that large: a corrupt field
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = float("nan")  # NaN = missing, counted and set to 0 by _tolerate
    id: int | str | None = None
    args: Args = _NO_ARGS


def entry_key(ev: Event, index: int) -> tuple[float, float, int]:
    """Order of op entry on one thread: start time, then Kineto's event index (outer before inner, and right at
    equal µs-rounded starts), else outer (longer) first."""
    idx = ev.args.ev_idx
    return (ev.ts, idx if isinstance(idx, int) else -ev.dur, index)


class _File(msgspec.Struct):
    traceEvents: list[Event] = msgspec.field(default_factory=list)
    distributedInfo: dict[str, Any] | None = None


@dataclass(slots=True)
class KinetoTrace:
    path: str
    events: list[Event]
    distributed: dict[str, Any] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None


_decoder = msgspec.json.Decoder(_File)
_list_decoder = msgspec.json.Decoder(list[Event])


def read_kineto(path: Path) -> KinetoTrace:
    data = read_bytes(path)
    stripped = data.lstrip()[:1]
    try:
        if stripped == b"[":  # the bare-array Chrome trace form
            doc = _File(traceEvents=_list_decoder.decode(data))
        else:
            doc = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        if b'"nodes"' in data[:4096] or b'"schema"' in data[:4096]:
            raise BadInput(path, "this looks like a host execution trace (has nodes/schema), not a Kineto trace") \
                from exc
        raise BadInput(path, f"not a Kineto trace: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise BadInput(path, f"not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise BadInput(path, "JSON nested too deeply") from exc
    if stripped == b"{" and b'"traceEvents"' not in data:
        if b'"nodes"' in data:
            raise BadInput(path, "this looks like a host execution trace (has nodes/schema), not a Kineto trace")
        raise BadInput(path, "not a Kineto trace: no traceEvents")
    trace = KinetoTrace(path=str(path), events=doc.traceEvents, distributed=doc.distributedInfo or {})
    _tolerate(trace)
    return trace


def _tolerate(trace: KinetoTrace) -> None:
    """Drop exact duplicate duration events, set negative or missing durations to 0; each counted as a warning."""
    seen: set[tuple[Any, ...]] = set()
    kept: list[Event] = []
    duplicates = negative = missing = 0
    for ev in trace.events:
        if ev.ph == "X":
            if ev.dur != ev.dur:  # NaN: no "dur" field
                ev.dur = 0.0
                missing += 1
            elif ev.dur < 0:
                ev.dur = 0.0
                negative += 1
            # a real duplicate repeats the ids too; equal zero-length ops at one timestamp are legitimate
            key = (ev.cat, ev.name, ev.pid, ev.tid, ev.ts, ev.dur, ev.args.external_id, ev.args.correlation)
            if key in seen and (ev.cat in CPU_OP_CATS or ev.cat in GPU_CATS or ev.cat in RUNTIME_CATS):
                duplicates += 1
                continue
            seen.add(key)
        kept.append(ev)
    trace.events = kept
    if duplicates:
        trace.warnings["duplicate_kineto_events"] = duplicates
    if negative:
        trace.warnings["negative_durations"] = negative
    if missing:
        trace.warnings["missing_durations"] = missing
