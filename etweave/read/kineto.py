"""Kineto (Chrome trace JSON) reader. msgspec decodes only the fields etweave uses into typed structs."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from etweave.errors import BadInput
from etweave.read import widths
from etweave.read.host_et import check_groups
from etweave.read.source import read_bytes
from etweave.values import as_int

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
_MAX_TIME = widths.MAX_TIME_MICROS


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


class _File(msgspec.Struct):
    # Raw: views into the input buffer, decoded one at a time (validated once, kept decoded or re-decoded later)
    traceEvents: list[msgspec.Raw] = msgspec.field(default_factory=list)
    distributedInfo: dict[str, Any] | None = None


# Inputs up to this size are decoded once and kept as objects (fastest); larger ones keep each event's raw JSON
# and decode it again when a stage reads it: decoded events take ~3x their JSON, raw views ~60 bytes.
# ETWEAVE_EAGER_BYTES overrides it (the tests force both ways).
EAGER_LIMIT = 64 << 20


def _eager_limit() -> int:
    value = os.environ.get("ETWEAVE_EAGER_BYTES", "")
    return int(value) if value.isdecimal() else EAGER_LIMIT


class EventTable(Sequence[Event]):
    """The trace's duration events ("X"), in file order, without exact duplicates: decoded objects, or raw JSON
    decoded on access (a small cache serves the repeated reads of one event in a row).

    Columns filled when the trace is read let the stages that scan every event pick theirs without decoding:
    per-category positions (`cpu`, `runtime`, `gpu`, `sync`), start times `ts`, the thread `tid`, Kineto's
    `correlation` (-1: none) and event index `ev_idx` (NO_INDEX: none)."""

    __slots__ = ("_cache", "_events", "_raws", "correlation", "cpu", "ev_idx", "gpu", "runtime", "sync", "tid",
                 "ts")

    def __init__(self, events: list[Event] | None = None, raws: list[msgspec.Raw] | None = None) -> None:
        self._events = events
        self._raws = raws
        self._cache: dict[int, Event] = {}
        self.cpu, self.runtime, self.gpu, self.sync = array("q"), array("q"), array("q"), array("q")
        self.ts, self.correlation, self.ev_idx = array("d"), array("q"), array("q")
        self.tid: list[int | str] = []

    def _add_columns(self, ev: Event, tids: dict[int | str, int | str]) -> None:
        n = len(self.ts)
        cat = ev.cat
        if cat in CPU_OP_CATS:
            self.cpu.append(n)
        elif cat in RUNTIME_CATS:
            self.runtime.append(n)
        elif cat in GPU_CATS:
            self.gpu.append(n)
        elif cat == SYNC_CAT:
            self.sync.append(n)
        self.ts.append(ev.ts)
        corr = as_int(ev.args.correlation)
        self.correlation.append(corr if corr is not None else -1)
        idx = ev.args.ev_idx
        self.ev_idx.append(idx if isinstance(idx, int) and not isinstance(idx, bool) and -_INT64 < idx < _INT64
                           else NO_INDEX)
        self.tid.append(tids.setdefault(ev.tid, ev.tid))  # one object per thread, not per event

    def entry_key(self, i: int) -> tuple[float, float, int]:
        """Order of op entry on one thread: start time, then Kineto's event index (outer before inner, and right
        at equal µs-rounded starts), else outer (longer) first. From the columns; decodes only without an index."""
        idx = self.ev_idx[i]
        return (self.ts[i], idx if idx != NO_INDEX else -self[i].dur, i)

    def __len__(self) -> int:
        return len(self._events) if self._events is not None else len(self._raws or ())

    def __getitem__(self, i: int) -> Event:  # type: ignore[override]  # by index only: no slices of the table
        if self._events is not None:
            return self._events[i]
        ev = self._cache.get(i)
        if ev is None:
            if len(self._cache) >= _CACHE:
                self._cache.clear()
            raws = self._raws
            assert raws is not None  # a table holds either its decoded events or their raw JSON
            ev = self._cache[i] = _normalized(_event_decoder.decode(raws[i]))
        return ev

    def __iter__(self) -> Iterator[Event]:
        if self._events is not None:
            yield from self._events
        else:
            for raw in self._raws or ():  # a pass over everything: decode without filling the cache
                yield _normalized(_event_decoder.decode(raw))


NO_INDEX = -(1 << 63)
_CACHE = 1 << 14
_decoder = msgspec.json.Decoder(_File)
_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_event_decoder = msgspec.json.Decoder(Event)


def _normalized(ev: Event) -> Event:
    if not ev.dur >= 0:  # NaN (no "dur") or negative: counted when the trace was read
        ev.dur = 0.0
    return ev


@dataclass(slots=True)
class KinetoTrace:
    path: str
    events: EventTable
    distributed: dict[str, Any] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None


def read_kineto(path: Path) -> KinetoTrace:
    data = read_bytes(path)
    stripped = bytes(data[:4096]).lstrip()[:1]  # not data.lstrip(): that copies the whole trace
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
    eager = len(data) <= _eager_limit()
    del data  # lazily read events keep views into it; eagerly read ones let it go
    warnings: dict[str, int] = {}
    distributed = _distributed(path, doc.distributedInfo or {})
    events = _validated(path, doc.traceEvents, eager, warnings)
    return KinetoTrace(path=str(path), events=events, distributed=distributed, warnings=warnings)


def _distributed(path: Path, info: dict[str, Any]) -> dict[str, Any]:
    """`distributedInfo`, its rank, world size and process groups checked (they size lists and name ranks)."""
    if info.get("rank") is not None:
        widths.rank(path, "distributedInfo.rank", info["rank"])
    if info.get("world_size") is not None:
        widths.world_size(path, "distributedInfo.world_size", info["world_size"])
    cfg = info.get("pg_config")
    if isinstance(cfg, list):
        check_groups(path, "distributedInfo.pg_config", cfg)
    return info


def _check_event(path: Path, n: int, ev: Event) -> None:
    """Numbers of one event that reach the output must fit it (field named); a negative size is no size."""
    if not widths.time_ok(ev.ts):
        raise BadInput(path, f"traceEvents[{n}].ts {ev.ts} out of range")
    if ev.dur >= widths.MAX_TIME_MICROS:  # NaN (missing) and negative durations are counted and set to 0
        raise BadInput(path, f"traceEvents[{n}].dur {ev.dur} out of range")
    for name, value in (("tid", ev.tid), ("pid", ev.pid)):
        if isinstance(value, int) and not widths.INT64_MIN <= value <= widths.INT64_MAX:
            raise BadInput(path, f"traceEvents[{n}].{name} {value} out of range (must fit a signed 64-bit integer)")
    args = ev.args
    if args is _NO_ARGS:
        return
    for label, value in (("In msg nelems", args.in_nelems), ("Out msg nelems", args.out_nelems)):
        if value is not None:
            count = as_int(value)
            if count is not None and not 0 <= count < 1 << 48:
                raise BadInput(path, f"traceEvents[{n}].args.'{label}' {count} is not an element count")


def _validated(path: Path, raws: list[msgspec.Raw], eager: bool, warnings: dict[str, int]) -> EventTable:
    """Decode every event once: a malformed one is bad input now, not deep in a later stage. Keep the duration
    events (and their columns), drop exact duplicates, count negative or missing durations (set to 0 when read)."""
    table = EventTable()
    tids: dict[int | str, int | str] = {}
    kept_raws: list[msgspec.Raw] = []
    kept: list[Event] = []
    seen: set[int] = set()  # hashes of the kept events' JSON: a set of ints is half a dict's memory
    suspects: list[int] = []  # kept positions whose hash was seen before: duplicates, or (rarely) collisions
    flags: dict[int, str] = {}  # kept position -> "missing" / "negative" duration
    for n, raw in enumerate(raws):
        raws[n] = None  # type: ignore[call-overload]  # an event not kept frees its view as we go
        ev = _decode_event(path, n, raw)
        if ev.ph != "X":
            continue
        # widths, inline on the common path (millions of events); _check_event names what is wrong
        tid, pid, args = ev.tid, ev.pid, ev.args
        if not -_MAX_TIME < ev.ts < _MAX_TIME or ev.dur >= _MAX_TIME \
                or (type(tid) is int and not -_INT64 <= tid < _INT64) \
                or (type(pid) is int and not -_INT64 <= pid < _INT64) \
                or (args is not _NO_ARGS and (args.in_nelems is not None or args.out_nelems is not None)):
            _check_event(path, n, ev)
        h = hash(bytes(raw))
        if h in seen:
            suspects.append(len(kept_raws))
        seen.add(h)
        if not ev.dur >= 0:
            flags[len(kept_raws)] = "missing" if ev.dur != ev.dur else "negative"
        ev = _normalized(ev)
        kept_raws.append(raw)
        table._add_columns(ev, tids)
        if eager:
            kept.append(ev)
    del seen
    duplicates = _duplicates(kept_raws, suspects)
    if duplicates:  # rare: rebuild the columns without them
        kept_raws = [r for j, r in enumerate(kept_raws) if j not in duplicates]
        kept = [e for j, e in enumerate(kept) if j not in duplicates]
        warnings["duplicate_kineto_events"] = len(duplicates)
        table = _table_of(kept_raws, tids)
    if eager:
        table._events = kept
    else:
        table._raws = kept_raws
    _count_durations(flags, duplicates, warnings)
    return table


def _decode_event(path: Path, n: int, raw: msgspec.Raw) -> Event:
    try:
        return _event_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadInput(path, f"not a Kineto trace: {exc} (in traceEvents[{n}])") from exc
    except msgspec.DecodeError as exc:  # the outer pass checks the structure only, not every string
        raise BadInput(path, f"not valid JSON: {exc} (in traceEvents[{n}])") from exc
    except RecursionError as exc:
        raise BadInput(path, "JSON nested too deeply") from exc


def _table_of(raws: list[msgspec.Raw], tids: dict[int | str, int | str]) -> EventTable:
    table = EventTable()
    for raw in raws:
        table._add_columns(_normalized(_event_decoder.decode(raw)), tids)
    return table


def _count_durations(flags: dict[int, str], duplicates: set[int], warnings: dict[str, int]) -> None:
    """Warnings for the kept events whose duration was negative or missing (read as 0)."""
    for kind in ("negative", "missing"):
        count = sum(1 for j, f in flags.items() if f == kind and j not in duplicates)
        if count:
            warnings[f"{kind}_durations"] = count


def _duplicates(raws: list[msgspec.Raw], suspects: list[int]) -> set[int]:
    """The suspects whose JSON is byte-identical to an earlier event's (the same event written twice)."""
    if not suspects:
        return set()
    wanted = {hash(bytes(raws[j])) for j in suspects}
    by_hash: dict[int, list[int]] = {}
    for j, raw in enumerate(raws):
        h = hash(bytes(raw))
        if h in wanted:
            by_hash.setdefault(h, []).append(j)
    out: set[int] = set()
    for positions in by_hash.values():
        texts: set[bytes] = set()
        for j in positions:  # ascending: the first of identical texts is kept
            text = bytes(raws[j])
            if text in texts:
                out.add(j)
            texts.add(text)
    return out
