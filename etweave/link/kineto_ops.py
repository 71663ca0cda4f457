"""Kineto cpu ops (`cpu_op` and `user_annotation` events) as host ops, where no host ET node stands for them.

`kineto_host`: a Kineto trace without a host ET. The cpu ops in a window stand in for host ops (a process root, one
thread root per Kineto thread, ops with fresh ids in entry order, parents by time containment on their thread),
with the `HostLink` that links each op to its own event, so the rest of the pipeline runs unchanged.

`add_unlinked_cpu_ops`: with a host ET, the cpu ops of the linked window that no host op stands for. Both return
new ops; neither changes the reader's `HostTrace`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from etweave.link.host import HostLink
from etweave.link.window import Window
from etweave.model import NESTING_EPS, Ids
from etweave.read.host_et import IO, PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, HostOp, HostTrace
from etweave.read.kineto import NO_INDEX, Event, EventTable, KinetoTrace
from etweave.read.widths import INT64_MAX, INT64_MIN
from etweave.values import as_int


def _window_threads(events: EventTable, window: Window | None) -> dict[int | str, list[int]]:
    """The cpu ops per Kineto thread, file order: those that start in `window` (all when None)."""
    threads: dict[int | str, list[int]] = {}
    lo, hi = window if window is not None else (-math.inf, math.inf)
    ts, tid = events.ts, events.tid
    for i in events.cpu:
        if lo <= ts[i] <= hi:  # a cpu op belongs to the window when it starts in it
            threads.setdefault(tid[i], []).append(i)
    return threads


def kineto_host(kineto: KinetoTrace, window: Window | None, ids: Ids) -> tuple[list[HostOp], HostLink]:
    """The ops that stand in for a host ET: of the cpu ops that start in `window` (all when None), ids from `ids`
    (a process root, the thread roots, then the ops in entry order), and their link."""
    events = kineto.events
    threads = _window_threads(events, window)
    # ET thread ids are ints: a Kineto tid that is not one gets a number above every int tid.
    tids = sorted(threads, key=lambda t: (not isinstance(t, int), str(t)))
    spare = max((t for t in tids if isinstance(t, int)), default=0) + 1
    et_tid = {t: (t if isinstance(t, int) else spare + n) for n, t in enumerate(tids)}
    no = {t: n for n, t in enumerate(tids)}
    empty = _NO_IO
    root_id = ids.next()
    ops = [_op(root_id, PROCESS_ROOT_NAMES[0], root_id, 0, empty)]
    thread_root = {t: ids.next() for t in tids}
    ops += [_op(thread_root[t], THREAD_ROOT_NAMES[0], root_id, et_tid[t], empty) for t in tids]
    # Fresh ids in entry order, as the host ET's counter hands them out at op entry: start time across threads,
    # and within a thread Kineto's entry order (outer before inner at equal starts).
    # (each thread's ops sorted once in entry order, which _parents walks too; then a sort of (start, thread,
    # place) tuples, compared in C, orders them across threads: no key function called per op)
    threads = {t: sorted(idx, key=_entry_key(events)) for t, idx in threads.items()}
    pairs = [(t, i) for t, idx in threads.items() for i in idx]
    places = sorted(zip(map(events.ts.__getitem__, map(_SECOND, pairs)), map(no.__getitem__, map(_FIRST, pairs)),
                        range(len(pairs)), strict=True))
    order = list(map(pairs.__getitem__, map(_THIRD, places)))
    id_of = dict(zip(map(_SECOND, order), ids.take(len(order)), strict=True))
    parent_of, partial = _parents(events, threads, id_of, thread_root, in_entry_order=True)
    ops += [_cpu_op(events[i], id_of[i], parent_of[i], et_tid[t]) for t, i in order]
    link = HostLink("kineto", {id_of[i]: i for _, i in order}, {et_tid[t]: t for t in tids}, window=window)
    if partial:
        link.warnings["kineto_cpu_ops_partly_overlapping"] = partial
    return ops, link


def add_unlinked_cpu_ops(host: HostTrace, kineto: KinetoTrace, link: HostLink, ids: Ids) -> list[HostOp]:
    """Kineto cpu ops in the linked window that no host ET node stands for (recorded while the observer was
    off, or on a thread it did not see) become ops too, with fresh ids from `ids` (above the host's): nothing is
    lost. Returns them; each is linked to its own event in `link`.

    Each one's parent is the innermost op containing it on its Kineto thread (a host op where that one is
    linked), else its thread's root; its ET tid is the host thread linked to that Kineto thread, else the
    Kineto tid itself."""
    if link.window is None:
        return []
    events = kineto.events
    linked = {i: op_id for op_id, i in link.event_of.items()}
    threads = _window_threads(events, link.window)
    new = sorted((i for idx in threads.values() for i in idx if i not in linked),
                 key=lambda i: (events.ts[i], events.entry_key(i)))
    if not new:
        return []
    et_of = {ktid: et for et, ktid in link.kthread_of.items()}
    roots = {op.et_tid: op.id for op in host.ops if op.is_thread_root}
    process_root = next((op.id for op in host.ops if op.is_process_root), 0)
    id_of = dict(linked)
    for i in new:
        id_of[i] = ids.next()
    fallback = {t: roots.get(et_of[t], process_root) if t in et_of else process_root for t in threads}
    parent_of, _ = _parents(events, threads, id_of, fallback)
    added = []
    for i in new:
        ev = events[i]
        op = _cpu_op(ev, id_of[i], parent_of[i], et_of.get(ev.tid, ev.tid if isinstance(ev.tid, int) else 0))
        added.append(op)
        link.event_of[op.id] = i
    return added


def _cpu_op(ev: Event, op_id: int, parent: int, tid: int) -> HostOp:
    """A Kineto cpu op as a host op: its `Record function id`, `Sequence number` and input shapes and types."""
    args = ev.args
    dims, types = args.input_dims, args.input_type
    inputs = _NO_IO if dims is None and types is None else IO(_NONE, _list(dims), _list(types))
    rf_id, seq = args.rf_id, args.seq_number
    # (as_int read inline where the id is absent or a plain int: most ops)
    rf_id = 0 if rf_id is None else rf_id if type(rf_id) is int and 0 <= rf_id <= INT64_MAX else as_int(rf_id, 0) or 0
    seq = -1 if seq is None else seq if type(seq) is int and INT64_MIN <= seq <= INT64_MAX else as_int(seq, -1)
    return HostOp(id=op_id, name=ev.name, parent=parent, et_tid=tid, rf_id=rf_id, seq_id=seq if seq is not None else -1,
                  fw_parent=0, fw_tid=0, scope=0, op_schema="", inputs=inputs, outputs=_NO_IO)


_FIRST, _SECOND, _THIRD = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


def _entry_key(events: EventTable) -> Callable[[int], tuple[float, float, int]]:
    """`EventTable.entry_key` on the columns bound once (a plain function, not a method looking them up)."""
    ts, dur, ev_idx = events.ts, events.dur, events.ev_idx
    return lambda i: (ts[i], x if (x := ev_idx[i]) != NO_INDEX else -dur[i], i)


def _parents(events: EventTable, threads: dict[int | str, list[int]], id_of: dict[int, int],
             thread_root: dict[int | str, int], in_entry_order: bool = False) -> tuple[dict[int, int], int]:
    """Each op's parent id: the innermost op on its thread whose time contains it, else the thread root
    (`in_entry_order`: each thread's ops are in entry order already)."""
    parent_of: dict[int, int] = {}
    partial = 0
    ts, dur = events.ts, events.dur  # (the events' start and duration, from the columns)
    ulp = math.ulp
    for t, idx in threads.items():
        stack: list[tuple[int, float]] = []  # (position, end) of the ops open at this op's start
        for i in idx if in_entry_order else sorted(idx, key=events.entry_key):
            start = ts[i]
            end = start + dur[i]
            # Epoch-µs floats near 1.7e15 hold only quarter µs: allow a couple of units in the last place.
            tol = 2 * ulp(end)
            if tol < NESTING_EPS:  # (max(NESTING_EPS, tol))
                tol = NESTING_EPS
            while stack and stack[-1][1] <= start + NESTING_EPS:
                stack.pop()
            # An op that starts inside another but ends after it (unbalanced annotations) is not contained: its
            # parent is the innermost op that does contain it.
            k = len(stack) - 1
            while k >= 0 and stack[k][1] < end - tol:
                k -= 1
            if k != len(stack) - 1:
                partial += 1
            parent_of[i] = id_of[stack[k][0]] if k >= 0 else thread_root[t]
            stack.append((i, end))
    return parent_of, partial


# No values, shapes or types: one object shared by the ops without them (nothing changes an op's IO once made; a
# trace has one op per cpu op event: an IO and three lists each per op held about 25 MB on allreduce-2020).
_NONE: list[Any] = []
_NO_IO = IO(_NONE, _NONE, _NONE)


def _op(op_id: int, name: str, parent: int, tid: int, inputs: IO) -> HostOp:
    return HostOp(id=op_id, name=name, parent=parent, et_tid=tid, rf_id=0, seq_id=-1, fw_parent=0, fw_tid=0,
                  scope=0, op_schema="", inputs=inputs, outputs=_NO_IO)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
