"""Kineto (Chrome trace JSON) reader. msgspec decodes only the fields etweave uses into typed structs."""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import os
import struct
import sys
from array import array
from collections.abc import Collection, Iterable, Iterator, Sequence
from itertools import compress, count, islice
from pathlib import Path
from typing import Annotated, Any

import msgspec

from etweave.errors import BadInput
from etweave.read import widths
from etweave.read.host_et import check_groups
from etweave.read.source import read_bytes
from etweave.read.widths import INT64_MAX, INT64_MIN
from etweave.values import as_int

CPU_OP_CATS = frozenset({"cpu_op", "user_annotation"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
SYNC_CAT = "cuda_sync"
_SYNC_CATS = frozenset({SYNC_CAT})


# gc=False: events hold no reference cycles, and tracking millions of them made the collector the largest cost.
# Only the args some stage reads (or the reader checks): others ("External id", "Fwd thread id", "Group size",
# "bytes") are skipped by the decode, not kept per event (on allreduce-2020 about 14 MB of a 136 MB read).
class Args(msgspec.Struct, frozen=True, gc=False):
    rf_id: Any = msgspec.field(default=None, name="Record function id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    seq_number: Any = msgspec.field(default=None, name="Sequence number")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    wait_on_stream: Any = None
    wait_on_event_corr: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")
    ev_idx: Any = msgspec.field(default=None, name="Ev Idx")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")


_NO_ARGS = Args()


_MAX_TIME = widths.MAX_TIME_MICROS


class Event(msgspec.Struct, gc=False):
    """A duration event ("X"): the fields etweave reads. (Its phase is read by the decoders below.)"""

    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = float("nan")  # NaN = missing, counted and set to 0 by _tolerate
    id: int | str | None = None
    args: Args = _NO_ARGS


class _Phased(Event):
    """Any event, its phase read: what each raw view decodes to, the duration ones kept."""

    ph: str = ""


# The whole-file decode types every number that reaches the output or a column to what the checks accept (the
# widths of `_check_event`, the ids the columns hold as they are): a trace with anything else fails that decode
# and is read by its raw views, which check and name it, so the events it does keep need no check.
_INT64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
_ELEMENTS = Annotated[int, msgspec.Meta(ge=0, lt=1 << 48)]
_TIME = Annotated[float, msgspec.Meta(gt=-_MAX_TIME, lt=_MAX_TIME)]
_DURATION = Annotated[float, msgspec.Meta(lt=_MAX_TIME)]  # negative or missing (NaN): counted, read as 0


class _TypedArgs(Args, frozen=True, gc=False):
    """`Args` as the whole-file decode reads them: the ids 64-bit ints, the element counts in range."""

    correlation: _INT64 | None = None
    rf_id: _INT64 | None = msgspec.field(default=None, name="Record function id")
    seq_number: _INT64 | None = msgspec.field(default=None, name="Sequence number")
    in_nelems: _ELEMENTS | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: _ELEMENTS | None = msgspec.field(default=None, name="Out msg nelems")
    ev_idx: _INT64 | None = msgspec.field(default=None, name="Ev Idx")


class _Duration(Event, tag_field="ph", tag="X"):
    """A duration event as the whole-file decode reads it: one member of the union of every phase, its numbers
    typed so that it needs no further check."""

    ts: _TIME = 0.0
    dur: _DURATION = float("nan")
    pid: _INT64 | str = 0
    tid: _INT64 | str = 0
    args: _TypedArgs = _TypedArgs()


class _CheckedArgs(msgspec.Struct, frozen=True, gc=False):
    """The typed fields of `Args` (the others take any value)."""

    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    dtype: str | None = None
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")


class _Other(Event):
    """An event of another phase in the whole-file decode: its fields checked as `Event`'s (a wrong one is bad
    input there too), its args' only as far as they are typed (the rest would be kept for nothing), dropped."""

    args: _CheckedArgs = _CheckedArgs()  # type: ignore[assignment]  # a narrower view of the same JSON object


# The phases of the Chrome trace format but "X". An event of any other phase (or none) fails the whole-file decode,
# which then reads the trace by raw views, as it does when anything else does not decode.
_OTHER_PHASES = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c")
_OTHERS = tuple(msgspec.defstruct(f"_Other_{phase}", [], bases=(_Other,), tag_field="ph", tag=phase, gc=False)
                for phase in _OTHER_PHASES)
_ANY_PHASE: Any = functools.reduce(operator.or_, _OTHERS, _Duration)  # _Duration | _Other_B | ...


class _File(msgspec.Struct):
    # Raw: views into the input buffer, decoded one at a time (validated once, kept decoded or re-decoded later)
    traceEvents: list[msgspec.Raw] = msgspec.field(default_factory=list)
    distributedInfo: dict[str, Any] | None = None


# The whole file typed: each event one member of the union, by its "ph".
_TypedFile: Any = msgspec.defstruct("_TypedFile", [
    ("traceEvents", list[_ANY_PHASE], msgspec.field(default_factory=list)),
    ("distributedInfo", dict[str, Any] | None, None)])


# Inputs up to this size are decoded once and kept as objects (fastest); larger ones keep each event's raw JSON
# and decode it again when a stage reads it: decoded events take ~3x their JSON, raw views ~60 bytes.
# ETWEAVE_EAGER_BYTES overrides it (the tests force both ways).
EAGER_LIMIT = 64 << 20


def _eager_limit() -> int:
    value = os.environ.get("ETWEAVE_EAGER_BYTES", "")
    return int(value) if value.isdecimal() else EAGER_LIMIT


# The columns of an `EventTable` (see its docstring).
COLUMNS = ("cpu", "runtime", "gpu", "sync", "ts", "dur", "tid", "name", "correlation", "ev_idx", "seq", "rf_id")


class EventTable(Sequence[Event]):
    """The trace's duration events ("X"), in file order, without exact duplicates: decoded objects, or raw JSON
    decoded on access (a small cache serves the repeated reads of one event in a row).

    Columns filled when the trace is read let the stages that scan every event pick theirs without decoding:
    per-category positions (`cpu`, `runtime`, `gpu`, `sync`), start times `ts`, durations `dur` (missing or
    negative: 0), the thread `tid`, the `name`, Kineto's `correlation` (-1: none), event index `ev_idx`
    (NO_INDEX: none), `Sequence number` `seq` (-1: none) and `Record function id` `rf_id` (0: none); an id
    beyond 64 bits (a string can spell one) is held as the nearest 64-bit bound: present, matching nothing real."""

    __slots__ = ("_cache", "_events", "_raws", "_released", "correlation", "cpu", "dur", "ev_idx", "gpu", "name",
                 "rf_id", "runtime", "seq", "sync", "tid", "ts")

    def __init__(self, events: list[Event] | None = None, raws: list[msgspec.Raw] | None = None) -> None:
        self._events = events
        self._raws = raws
        self._cache: dict[int, Event] = {}
        self._released: int | None = None  # the number of events, once they were let go (`release`)
        self.cpu, self.runtime, self.gpu, self.sync = array("q"), array("q"), array("q"), array("q")
        self.ts, self.dur = array("d"), array("d")
        self.correlation, self.ev_idx, self.seq, self.rf_id = array("q"), array("q"), array("q"), array("q")
        self.tid: list[int | str] = []
        self.name: list[str] = []

    def _add_columns(self, evs: Sequence[Event], interned: dict[Any, Any] | None, typed: bool = False,
                     durations: list[float] | None = None) -> None:
        """Append the columns of these (normalized) events: whole-list passes, no method call per event.
        `interned`: one object per distinct thread id and name, shared by every chunk of one trace (None: the
        events are kept, and hold them anyway). `typed`: decoded by the whole-file decode, whose ids are each a
        64-bit int or None (`_TypedArgs`). `durations`: theirs, when read already."""
        base = len(self.ts)
        _extend(self.ts, [e.ts for e in evs])
        _extend(self.dur, [e.dur for e in evs] if durations is None else durations)
        _add_positions((self.cpu, self.runtime, self.gpu, self.sync), evs, base)
        args = [e.args for e in evs]
        if typed:
            _extend(self.correlation, [-1 if (c := a.correlation) is None else c for a in args])
            _extend(self.ev_idx, [NO_INDEX if (i := a.ev_idx) is None else i for a in args])  # (NO_INDEX: INT64_MIN)
            _extend(self.seq, [-1 if (s := a.seq_number) is None else s for a in args])
            _extend(self.rf_id, [0 if (r := a.rf_id) is None else r for a in args])
        else:
            self._add_any_ids(args)
        del args
        tids, names = [e.tid for e in evs], [e.name for e in evs]
        if interned is None:
            self.tid += tids
            self.name += names
        else:  # one object per thread and per name, not per event
            self.tid += map(interned.setdefault, tids, tids)
            self.name += map(interned.setdefault, names, names)

    def _add_any_ids(self, args: list[Args]) -> None:
        """The id columns of these args, whatever their JSON types."""
        # most events have no such id, and most that have one have a plain int: _id_column reads the rest
        _extend(self.correlation, [-1 if (c := a.correlation) is None
                                   else c if type(c) is int and INT64_MIN <= c <= INT64_MAX
                                   else _id_column(c, -1) for a in args])
        _extend(self.ev_idx, [i if type(i := a.ev_idx) is int and INT64_MIN < i <= INT64_MAX else NO_INDEX
                              for a in args])
        _extend(self.seq, [-1 if (s := a.seq_number) is None else s if type(s) is int and INT64_MIN <= s <= INT64_MAX
                           else _id_column(s, -1) for a in args])
        _extend(self.rf_id, [0 if (r := a.rf_id) is None else r if type(r) is int and INT64_MIN <= r <= INT64_MAX
                             else _id_column(r, 0) for a in args])

    def entry_key(self, i: int) -> tuple[float, float, int]:
        """Order of op entry on one thread: start time, then Kineto's event index (outer before inner, and right
        at equal µs-rounded starts), else outer (longer) first. From the columns."""
        idx = self.ev_idx[i]
        return (self.ts[i], idx if idx != NO_INDEX else -self.dur[i], i)

    def at(self, positions: Iterable[int]) -> list[Event]:
        """The events at these positions (decoded ones picked in C; raw ones decoded as `table[i]` does)."""
        if self._events is not None:
            return list(map(self._events.__getitem__, positions))
        return [self[i] for i in positions]

    def share_strings(self) -> None:
        """Make the events share one object per distinct name and per distinct thread id (the whole-file decode
        gives each event its own): for a conversion whose items copy every event's name and thread (Kineto only),
        and hold them to its end. On allreduce-2020 the names took ~12 MB, the thread ids ~3 MB, for 120 and 5
        distinct values. Events decoded on access (raw views) are left as they are."""
        if self._events is None:
            return
        shared: dict[Any, Any] = {}
        self.name = list(map(shared.setdefault, self.name, self.name))  # (the columns hold the events' objects)
        self.tid = list(map(shared.setdefault, self.tid, self.tid))
        collections.deque(map(setattr, self._events, itertools.repeat("name"), self.name), 0)
        collections.deque(map(setattr, self._events, itertools.repeat("tid"), self.tid), 0)

    def release(self, keep: Collection[str] = COLUMNS) -> None:
        """Let go of the events (decoded, or their raw JSON) and of the columns not named in `keep` (all kept when
        not given): for a conversion that read the trace itself, once its graph is built (no later stage reads an
        event). Reading an event after it is a bug, and so is reading a column let go (an AttributeError)."""
        self._released = len(self)
        self._events, self._raws = None, None
        self._cache.clear()
        for column in COLUMNS:
            if column not in keep and hasattr(self, column):
                delattr(self, column)

    def __len__(self) -> int:
        if self._released is not None:
            return self._released
        return len(self._events) if self._events is not None else len(self._raws or ())

    def __getitem__(self, i: int) -> Event:  # type: ignore[override]  # by index only: no slices of the table
        if self._events is not None:
            return self._events[i]
        if self._released is not None:
            raise RuntimeError("a Kineto event was read after the events were let go (EventTable.release)")
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
        elif self._released is not None:
            raise RuntimeError("the Kineto events were read after they were let go (EventTable.release)")
        else:
            for raw in self._raws or ():  # a pass over everything: decode without filling the cache
                yield _normalized(_event_decoder.decode(raw))


def _extend(column: array[Any], values: list[Any]) -> None:
    """`column.fromlist(values)` in fewer steps: packed in one call (`fromlist` parses each value on its own)."""
    column.frombytes(struct.pack(f"{len(values)}{column.typecode}", *values))


# The per-category position columns (cpu, runtime, gpu, sync): each one's categories, by its code (from 1).
_CATEGORY_CODE = {cat: code for code, cats in enumerate((CPU_OP_CATS, RUNTIME_CATS, GPU_CATS, _SYNC_CATS), 1)
                  for cat in cats}


def _add_positions(columns: tuple[array[int], ...], evs: Sequence[Event], base: int) -> None:
    """Append to each of `columns` (cpu, runtime, gpu, sync) the positions (from `base`) of its categories' events,
    in one pass (fewer steps than a pass per column)."""
    found: tuple[list[int], ...] = ([], [], [], [], [])  # by category code; 0: none of the four
    code = _CATEGORY_CODE.get
    for i, ev in enumerate(evs, base):
        found[code(ev.cat, 0)].append(i)
    for column, positions in zip(columns, found[1:], strict=True):
        _extend(column, positions)


def _id_column(value: Any, default: int) -> int:
    """An id that is not a plain 64-bit int, as a column holds it: `as_int`'s reading, else `default`; one beyond
    64 bits (a string can spell it) at the nearest 64-bit bound."""
    number = as_int(value, default)
    return default if number is None else max(INT64_MIN, min(number, INT64_MAX))


NO_INDEX = -(1 << 63)
_CACHE = 1 << 14
_decoder = msgspec.json.Decoder(_File)
_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_event_decoder = msgspec.json.Decoder(_Phased)
_typed_decoder = msgspec.json.Decoder(_TypedFile)
_typed_list_decoder = msgspec.json.Decoder(list[_ANY_PHASE])


def _normalized(ev: Event) -> Event:
    if not ev.dur >= 0:  # NaN (no "dur") or negative: counted when the trace was read
        ev.dur = 0.0
    return ev


class KinetoTrace(msgspec.Struct):
    path: str
    events: EventTable
    distributed: dict[str, Any] = msgspec.field(default_factory=dict)
    warnings: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) else None


def read_kineto(path: Path) -> KinetoTrace:
    data = read_bytes(path)
    stripped = bytes(data[:4096]).lstrip()[:1]  # not data.lstrip(): that copies the whole trace
    eager = len(data) <= _eager_limit()
    # Eager: the whole file decoded typed in one call, no raw view per event; when that fails, the raw views tell
    # which event is wrong and how.
    typed = _decoded(data, stripped) if eager else None
    if typed is None:
        doc = _outer(path, data, stripped)
        info, raws, evs = doc.distributedInfo, doc.traceEvents, None
    else:
        (info, evs), raws = typed, None
        del typed
    if stripped == b"{" and b'"traceEvents"' not in data:
        if b'"nodes"' in data:
            raise BadInput(path, "this looks like a host execution trace (has nodes/schema), not a Kineto trace")
        raise BadInput(path, "not a Kineto trace: no traceEvents")
    warnings: dict[str, int] = {}
    distributed = _distributed(path, info or {})
    events = _validated(path, data, raws, evs, eager, warnings)
    # lazily read events keep views into `data`; eagerly read ones let it go
    return KinetoTrace(path=str(path), events=events, distributed=distributed, warnings=warnings)


def _decoded(data: bytes | bytearray, stripped: bytes) -> tuple[dict[str, Any] | None, list[Event]] | None:
    """The whole trace decoded typed (its distributedInfo and its events, those of other phases than "X" as
    `_Other`s), or None when anything in it does not decode."""
    try:
        if stripped == b"[":
            return None, _typed_list_decoder.decode(data)
        typed = _typed_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    return typed.distributedInfo, typed.traceEvents


def _outer(path: Path, data: bytes | bytearray, stripped: bytes) -> _File:
    """The trace with each event as its raw JSON view: bad input when its structure is not a Kineto trace's."""
    try:
        if stripped == b"[":  # the bare-array Chrome trace form
            return _File(traceEvents=_list_decoder.decode(data))
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        if b'"nodes"' in data[:4096] or b'"schema"' in data[:4096]:
            raise BadInput(path, "this looks like a host execution trace (has nodes/schema), not a Kineto trace") \
                from exc
        raise BadInput(path, f"not a Kineto trace: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise BadInput(path, f"not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise BadInput(path, "JSON nested too deeply") from exc


def _raw_events(data: bytes | bytearray) -> list[msgspec.Raw]:
    """Each event's raw JSON view, of a trace whose structure decoded before."""
    stripped = bytes(data[:4096]).lstrip()[:1]
    return _list_decoder.decode(data) if stripped == b"[" else _decoder.decode(data).traceEvents


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


# Events decoded at a time above the eager limit: a chunk's decoded events are dropped once its columns are built.
_CHUNK = 1 << 13


class _Irregular(Exception):
    """A whole-list check found something out of range or undecodable: the per-event check finds and names it."""


def _validated(path: Path, data: bytes | bytearray, raws: list[msgspec.Raw] | None, evs: list[Event] | None,
               eager: bool, warnings: dict[str, int]) -> EventTable:
    """Check every event once: a malformed one is bad input now, not deep in a later stage. Keep the duration
    events (and their columns), drop exact duplicates, count negative or missing durations (set to 0). `evs`: the
    events decoded already (eager), else `raws`: their JSON views."""
    try:
        if evs is not None:
            return _from_decoded(evs, data, warnings)
        assert raws is not None
        return _read_events(raws, eager, warnings)
    except _Irregular:
        _raise_first_problem(path, _raw_events(data))
        raise AssertionError("a whole-list check refused what the per-event check accepts") from None


def _from_decoded(evs: list[Event], data: bytes | bytearray, warnings: dict[str, int]) -> EventTable:
    """The eager path over the events of the whole-file decode, whose types checked every number (`_Duration`)."""
    xs: list[Event] = [e for e in evs if type(e) is _Duration]
    flags: dict[int, str] = {}
    table = EventTable()
    table._add_columns(xs, None, typed=True, durations=_note_durations(xs, 0, flags))
    duplicates: set[int] = set()
    # Byte-identical events decode alike: only when some decoded alike do their JSON texts decide (exact rule).
    if _decoded_alike(table):
        x_raws = list(compress(_raw_events(data), [type(e) is _Duration for e in evs]))
        duplicates = _duplicates(x_raws, _repeated_hashes(x_raws))
    return _without_duplicates(table, xs, None, duplicates, flags, warnings)


def _decoded_alike(table: EventTable) -> bool:
    """Whether two events have the same start, duration, thread, name, correlation and event index: the starts
    that repeat first (neighbours once sorted; few events share one), then the full key of the events with one."""
    ts = table.ts.tolist()
    ordered = sorted(ts)
    repeated = set(compress(ordered, map(operator.eq, ordered, islice(ordered, 1, None))))  # (C, not float.__eq__)
    if not repeated:
        return False
    sharing = list(compress(count(), map(repeated.__contains__, ts)))  # every event whose start repeats (two or more)
    pick = operator.itemgetter(*sharing)
    keys = set(zip(pick(ts), pick(table.dur), pick(table.tid), pick(table.name), pick(table.correlation),
                   pick(table.ev_idx), strict=True))
    return len(keys) < len(sharing)


def _read_events(raws: list[msgspec.Raw], eager: bool, warnings: dict[str, int]) -> EventTable:
    """The path over raw views, in whole-list passes per chunk (everything at once when eager), each chunk's views
    let go once read (the kept ones live on in the table); _Irregular when a check fails."""
    table = EventTable()
    interned: dict[Any, Any] = {}
    kept_raws: list[msgspec.Raw] = []
    kept: list[Event] = []
    flags: dict[int, str] = {}  # kept position -> "missing" / "negative" duration
    step = max(1, len(raws) if eager else _CHUNK)
    for start in range(0, len(raws), step):
        chunk = raws[start:start + step]
        raws[start:start + step] = [None] * len(chunk)  # type: ignore[list-item]  # only `chunk` holds them now
        try:
            evs = list(map(_event_decoder.decode, chunk))
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            raise _Irregular from None
        is_x = [e.ph == "X" for e in evs]
        xs, x_raws = list(compress(evs, is_x)), list(compress(chunk, is_x))
        del evs, chunk, is_x
        base = len(kept_raws)
        table._add_columns(xs, interned, durations=_note_durations(xs, base, flags))
        _check_widths(table, base, xs)
        kept_raws += x_raws
        if eager:
            kept += xs
    raws.clear()
    return _without_duplicates(table, kept if eager else None, kept_raws,
                               _duplicates(kept_raws, _repeated_hashes(kept_raws)), flags, warnings)


def _without_duplicates(table: EventTable, kept: list[Event] | None, kept_raws: list[msgspec.Raw] | None,
                        duplicates: set[int], flags: dict[int, str], warnings: dict[str, int]) -> EventTable:
    """The table holding the kept events (decoded, or their raw views), the duplicates dropped and counted."""
    if duplicates:  # rare: rebuild the columns without them
        if kept is not None:
            kept = [e for j, e in enumerate(kept) if j not in duplicates]
        if kept_raws is not None:
            kept_raws = [r for j, r in enumerate(kept_raws) if j not in duplicates]
        warnings["duplicate_kineto_events"] = len(duplicates)
        table = _table_of(kept, kept_raws or [])
    if kept is not None:
        table._events = kept
    else:
        table._raws = kept_raws
    _count_durations(flags, duplicates, warnings)
    return table


def _check_widths(table: EventTable, base: int, evs: Sequence[Event]) -> None:
    """_Irregular when a number of these events (the table's from `base`) that reaches the output does not fit it
    (see `_check_event`). The durations are normalized already: a missing or negative one is never too large."""
    ts, dur = table.ts[base:], table.dur[base:]
    if ts and (min(ts) <= -_MAX_TIME or max(ts) >= _MAX_TIME or max(dur) >= _MAX_TIME):  # no NaN: JSON has none
        raise _Irregular
    ids = set(table.tid[base:]) | {e.pid for e in evs}  # a handful of distinct threads and processes
    if [t for t in ids if type(t) is int and not INT64_MIN <= t <= INT64_MAX]:
        raise _Irregular
    for args in [a for e in evs if (a := e.args).in_nelems is not None or a.out_nelems is not None]:
        for value in (args.in_nelems, args.out_nelems):
            number = as_int(value) if value is not None else None
            if number is not None and not 0 <= number < 1 << 48:
                raise _Irregular


# The hashes of the kept events' JSON are checked for repeats a quarter at a time (by their low bits): a set of
# them all would be the largest object of reading a large trace.
_HASH_PARTS = 4
_PART_MASKS = [bytes(int(v % _HASH_PARTS == part) for v in range(256)) for part in range(_HASH_PARTS)]
_LOW_BYTE = 0 if sys.byteorder == "little" else 7  # of an array("q") item


def _repeated_hashes(raws: list[msgspec.Raw]) -> list[int]:
    """The positions whose JSON hashes as an earlier one's does: duplicates, or (rarely) collisions."""
    hashes = array("q")
    for start in range(0, len(raws), _CHUNK):
        hashes.fromlist(list(map(hash, map(bytes, raws[start:start + _CHUNK]))))
    low_bytes = hashes.tobytes()[_LOW_BYTE::8]
    suspects: list[int] = []
    for mask in _PART_MASKS:
        in_part = low_bytes.translate(mask)  # 1 where the hash is in this part: compress reads it in C
        if len(set(compress(hashes, in_part))) == in_part.count(1):  # the common case: no repeat in this part
            continue
        seen: set[int] = set()
        for j, h in zip(compress(count(), in_part), compress(hashes, in_part), strict=False):
            if h in seen:
                suspects.append(j)
            seen.add(h)
    return sorted(suspects)


def _note_durations(evs: Sequence[Event], base: int, flags: dict[int, str]) -> list[float]:
    """Flag and zero the negative and missing (NaN) durations; the durations, so zeroed."""
    durations = [e.dur for e in evs]
    total = sum(durations)
    if total == total and (not durations or min(durations) >= 0):  # no NaN (it would make the sum NaN), none < 0
        return durations
    for j in [j for j, d in enumerate(durations) if not d >= 0]:
        ev = evs[j]
        flags[base + j] = "missing" if ev.dur != ev.dur else "negative"
        ev.dur = durations[j] = 0.0
    return durations


def _raise_first_problem(path: Path, raws: list[msgspec.Raw]) -> None:
    """Event by event in file order, as bad input naming the first event and field that is wrong."""
    for n, raw in enumerate(raws):
        ev = _decode_event(path, n, raw)
        if ev.ph == "X":
            _check_event(path, n, ev)


def _decode_event(path: Path, n: int, raw: msgspec.Raw) -> _Phased:
    try:
        return _event_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadInput(path, f"not a Kineto trace: {exc} (in traceEvents[{n}])") from exc
    except msgspec.DecodeError as exc:  # the outer pass checks the structure only, not every string
        raise BadInput(path, f"not valid JSON: {exc} (in traceEvents[{n}])") from exc
    except RecursionError as exc:
        raise BadInput(path, "JSON nested too deeply") from exc


def _table_of(events: list[Event] | None, raws: list[msgspec.Raw]) -> EventTable:
    """The columns of these kept events (decoded again from `raws`, a chunk at a time, when not given)."""
    table = EventTable()
    interned: dict[Any, Any] = {}
    if events is not None:
        table._add_columns(events, None)
        return table
    for start in range(0, len(raws), _CHUNK):
        table._add_columns([_normalized(_event_decoder.decode(r)) for r in raws[start:start + _CHUNK]], interned)
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
