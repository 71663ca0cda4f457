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
from collections.abc import Callable, Iterable
from itertools import chain, repeat
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
    ts, tid = events.ts, events.tid
    if window is None:
        for i in events.cpu:
            threads.setdefault(tid[i], []).append(i)
        return threads
    lo, hi = window
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
    empty = _NO_IO
    root_id = ids.next()
    ops = [_op(root_id, PROCESS_ROOT_NAMES[0], root_id, 0, empty)]
    thread_root = {t: ids.next() for t in tids}
    ops += [_op(thread_root[t], THREAD_ROOT_NAMES[0], root_id, et_tid[t], empty) for t in tids]
    # Fresh ids in entry order, as the host ET's counter hands them out at op entry: start time across threads,
    # and within a thread Kineto's entry order (outer before inner at equal starts). Each thread's ops sorted
    # once in entry order (which _parents walks too), the threads one after another in `tids` order (an op's
    # place in that list); a stable sort of the places by start alone then orders them by (start, thread, place).
    sorted_threads = [_entry_sorted(events, threads[t]) for t in tids]
    places = list(chain.from_iterable(idx for idx, _ in sorted_threads))
    starts = list(chain.from_iterable(thread_starts for _, thread_starts in sorted_threads))
    by_start = sorted(range(len(places)), key=starts.__getitem__)  # place of the op with each id, in id order
    order = list(map(places.__getitem__, by_start))  # event of the op with each id
    # the ids as one list: the ops, their children's parents and the link share one int object per id (each pass
    # over a range makes its own)
    op_ids = list(ids.take(len(order)))
    # each place's op id (by the inverse permutation of by_start, sorted in C), then each thread root's
    id_at = list(map(op_ids.__getitem__, sorted(range(len(places)), key=by_start.__getitem__)))
    id_at += [thread_root[t] for t in tids]
    parent_at, partial = _parents(events, sorted_threads)
    thread_at = list(chain.from_iterable(repeat(et_tid[t], len(idx))
                                         for t, (idx, _) in zip(tids, sorted_threads, strict=True)))
    ops += _cpu_ops(events.at(order), op_ids, map(id_at.__getitem__, map(parent_at.__getitem__, by_start)),
                    map(thread_at.__getitem__, by_start))
    link = HostLink("kineto", dict(zip(op_ids, order, strict=True)), {et_tid[t]: t for t in tids}, window=window)
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
    parent_of: dict[int, int] = {}
    for t, idx in threads.items():  # a thread at a time: only one thread's lists are held at once
        in_order = _entry_sorted(events, idx)
        parent_at, _ = _parents(events, [in_order])
        id_at = [*map(id_of.__getitem__, in_order[0]), fallback[t]]
        parent_of.update(zip(in_order[0], map(id_at.__getitem__, parent_at), strict=True))
        del in_order, parent_at, id_at
    added = []
    for i in new:
        ev = events[i]
        op = _cpu_op(ev, id_of[i], parent_of[i], et_of.get(ev.tid, ev.tid if isinstance(ev.tid, int) else 0))
        added.append(op)
        link.event_of[op.id] = i
    return added


def _cpu_ops(evs: list[Event], op_ids: Iterable[int], parents: Iterable[int], tids: Iterable[int]) -> list[HostOp]:
    """`_cpu_op` of each event in turn; an op whose event records no ids, shapes or types (most) made inline."""
    ops: list[HostOp] = []
    add = ops.append
    for ev, op_id, parent, tid in zip(evs, op_ids, parents, tids, strict=True):
        args = ev.args
        if args.input_dims is None and args.input_type is None and args.rf_id is None and args.seq_number is None:
            add(HostOp(op_id, ev.name, parent, tid, 0, -1, 0, 0, 0, "", _NO_IO, _NO_IO, _NO_EXTRA))
        else:
            add(_cpu_op(ev, op_id, parent, tid))
    return ops


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


def _entry_key(events: EventTable) -> Callable[[int], tuple[float, float, int]]:
    """`EventTable.entry_key` on the columns bound once (a plain function, not a method looking them up)."""
    ts, dur, ev_idx = events.ts, events.dur, events.ev_idx
    return lambda i: (ts[i], x if (x := ev_idx[i]) != NO_INDEX else -dur[i], i)


def _entry_sorted(events: EventTable, idx: list[int]) -> tuple[list[int], list[float]]:
    """These positions (ascending) in entry order (`EventTable.entry_key`), and their starts in that order. Where
    every one has Kineto's event index (most traces), in C passes: as they are when their starts and event indices
    both never fall (what Kineto writes; a sort of a list in order only compares neighbours), else two stable
    sorts, by event index then by start (start, event index, position), without a key tuple per event."""
    indices = list(map(events.ev_idx.__getitem__, idx))
    ordered_indices = sorted(indices)
    starts = list(map(events.ts.__getitem__, idx))
    if ordered_indices and ordered_indices[0] == NO_INDEX:  # (the least int64: first when any)
        ordered = sorted(idx, key=_entry_key(events))
        return ordered, list(map(events.ts.__getitem__, ordered))
    if ordered_indices == indices and sorted(starts) == starts:
        return idx, starts
    order = sorted(range(len(idx)), key=indices.__getitem__)
    order.sort(key=starts.__getitem__)
    return list(map(idx.__getitem__, order)), list(map(starts.__getitem__, order))


def _parents(events: EventTable, threads: list[tuple[list[int], list[float]]]) -> tuple[list[int], int]:
    """The parent of each op, the threads' ops (each thread's in entry order, with their starts) taken one after
    another, as the place of its op in that list or, for the root of the thread at `threads[j]`, the number of ops
    + j: the innermost op on its thread whose time contains it, else the thread root. And how many ops only partly
    overlap the innermost op open at their start."""
    parents: list[int] = []
    add = parents.append
    partial = 0
    dur = events.dur
    ulp = math.ulp
    eps = NESTING_EPS
    place = 0
    root = sum(len(idx) for idx, _ in threads)
    for idx, starts in threads:
        stack: list[tuple[float, int]] = []  # (end, place) of the ops open at this op's start, outermost first
        push, pop = stack.append, stack.pop
        for start, end in zip(starts, map(operator.add, starts, map(dur.__getitem__, idx)), strict=True):
            if stack:
                closed = start + eps
                while stack and stack[-1][0] <= closed:
                    pop()
            if not stack:
                add(root)
            elif (top := stack[-1])[0] >= end - eps:  # the innermost open op contains it (the usual case; tol below)
                add(top[1])
            else:
                # Epoch-µs floats near 1.7e15 hold only quarter µs: allow a couple of units in the last place.
                tol = 2 * ulp(end)
                if tol < eps:  # (max(NESTING_EPS, tol))
                    tol = eps
                # An op that starts inside another but ends after it (unbalanced annotations) is not contained: its
                # parent is the innermost op that does contain it.
                k = len(stack) - 1
                while k >= 0 and stack[k][0] < end - tol:
                    k -= 1
                if k != len(stack) - 1:
                    partial += 1
                add(stack[k][1] if k >= 0 else root)
            push((end, place))
            place += 1
        root += 1
    return parents, partial


# No values, shapes or types: one object shared by the ops without them (nothing changes an op's IO once made; a
# trace has one op per cpu op event: an IO and three lists each per op held about 25 MB on allreduce-2020).
_NONE: list[Any] = []
_NO_IO = IO(_NONE, _NONE, _NONE)
# No extra attrs: one dict shared by those ops (only the host ET reader fills `extra`; the stages read it)
_NO_EXTRA: dict[str, Any] = {}


def _op(op_id: int, name: str, parent: int, tid: int, inputs: IO) -> HostOp:
    return HostOp(id=op_id, name=name, parent=parent, et_tid=tid, rf_id=0, seq_id=-1, fw_parent=0, fw_tid=0,
                  scope=0, op_schema="", inputs=inputs, outputs=_NO_IO)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
