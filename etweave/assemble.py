"""Stage build_graph (assemble): one item per future node (host ops, thread roots, runtime calls, GPU events), each CPU
thread's program order with exclusive durations from time containment, and each GPU stream's order.

This is where the reader's records end: each item carries the fields later stages read of its host op
(`OpRecord`) and of its Kineto event (`correlation`, `device`, `stream`, `KinetoArgs`), decoded here once, and the
`cuda_sync` events become `SyncRecord`s. No later stage reads a `HostOp`, an `Event` or its `args`."""

from __future__ import annotations

import itertools
import math
import operator
from collections import defaultdict

from etweave.conversion import Conversion, need
from etweave.link import DeviceSelection, HostLink
from etweave.model import (
    DELAY,
    GPU_KINDS,
    HOST_OP,
    HOST_OP_KIND,
    KERNEL,
    MEMCPY,
    MEMSET,
    NESTING_EPS,
    PROCESS_ROOT,
    RUNTIME,
    RUNTIME_KIND,
    SELF_PART,
    THREAD_ROOT,
    THREAD_ROOT_KIND,
    CommArgs,
    Graph,
    Ids,
    InputFiles,
    Item,
    KinetoArgs,
    OpRecord,
    SyncRecord,
    first_measured_start,
)
from etweave.read.host_et import PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, HostOp
from etweave.read.kineto import Args, Event, KinetoTrace
from etweave.read.widths import INT64_MAX, INT64_MIN
from etweave.repair import Repair, is_collective_call
from etweave.values import as_int, tensors

_GPU_KIND = {"kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
             "gpu_memset": MEMSET, "Memset": MEMSET}


def assemble(c: Conversion) -> Graph:
    """The graph of the conversion's linked and repaired ops and its device events, ids from its allocator."""
    kineto, device = c.kineto, c.device
    # the items of each kind, as they are made: the graph's index of kinds (`Graph.index_kinds`)
    by_kind = _host_items(c.ops, kineto, need(c.link, "link"), need(c.repair, "repair"))
    if kineto is not None and device is not None:
        by_kind.update(_device_items(kineto, device, c.ids))
    for kind in (PROCESS_ROOT, THREAD_ROOT, HOST_OP):
        by_kind[kind].sort(key=_ID)  # (in op order: in id order already, but for host ops out of it)
    items = list(itertools.chain.from_iterable(by_kind.values()))
    items.sort(key=_ID)  # (a merge of the kinds' runs)
    files = InputFiles(c.host.path if c.host is not None else "", kineto.path if kineto is not None else "")
    # the waits stage reads the sync calls: which stream or event a sync call waited on
    sync = list(map(sync_record, kineto.events.at(kineto.events.sync))) if kineto is not None else []
    g = Graph(items=items, by_id={it.id: it for it in items}, ids=c.ids, rank=c.rank, files=files, sync_events=sync)
    g.index_kinds(by_kind)
    if c.inputs_handed_over:  # before the sweeps: the periods they make then take the memory the inputs held
        c.let_go_of_inputs()
    _thread_order(g)
    _stream_order(g)
    return g


def _host_items(ops: list[HostOp], kineto: KinetoTrace | None, link: HostLink, rep: Repair) -> dict[str, list[Item]]:
    """The items of the host ops, per kind (each in op order)."""
    by_kind: dict[str, list[Item]] = {PROCESS_ROOT: [], THREAD_ROOT: [], HOST_OP: []}
    parent_of, kthread_of = rep.parent_of.get, link.kthread_of.get
    orphan_parent = rep.orphan_parent.get if rep.orphan_parent else None  # (most traces have no orphan)
    # each op's event position (None: not linked), and the linked ones' events in turn, picked in C
    positions = list(map(link.event_of.get, map(_ID, ops)))
    linked = iter(kineto.events.at([i for i in positions if i is not None]) if kineto is not None else ())
    by_name: dict[str, tuple[str, list[Item], bool, bool]] = {}  # what an op's name decides, once per name
    for op, i in zip(ops, positions, strict=True):
        name = op.name
        of_name = by_name.get(name)
        if of_name is None:
            of_name = by_name[name] = _of_name(op, by_kind)
        kind, items, collective_call, comm = of_name
        inputs, outputs = op.inputs, op.outputs
        # op_record inline where there is nothing to decode (most ops: every one of a Kineto-only conversion)
        host = op_record(op) if comm or inputs.values or outputs.values else \
            OpRecord(op.et_tid, op.parent, op.rf_id, op.seq_id, op.op_schema, inputs, outputs, (), (), collective_call,
                     None, op.fw_tid)
        op_id = op.id
        # (positional: one call per item; the fields in `Item`'s order)
        if i is not None:
            ev = next(linked)
            dur = ev.dur
            items.append(Item(op_id, kind, name, ev.ts, dur, dur, 0.0, True, ev.tid, None, None, host, None,
                              kineto_args(ev.args), parent_of(op_id),
                              orphan_parent(op_id) if orphan_parent is not None else None))
        else:
            items.append(Item(op_id, kind, name, 0.0, 0.0, 0.0, 0.0, False,
                              kthread_of(op.et_tid, op.et_tid) if kind != PROCESS_ROOT else None, None, None, host,
                              None, None, parent_of(op_id),
                              orphan_parent(op_id) if orphan_parent is not None else None))
    process_root = _process_root_id(ops) if rep.synthesized_roots else None
    for et_tid, root_id in sorted(rep.synthesized_roots.items()):
        by_kind[THREAD_ROOT].append(Item(id=root_id, kind=THREAD_ROOT, name=f"[etweave|synthesized|thread {et_tid}]",
                                         tid=link.kthread_of.get(et_tid, et_tid), parent=process_root))
    return by_kind


def _of_name(op: HostOp, by_kind: dict[str, list[Item]]) -> tuple[str, list[Item], bool, bool]:
    """What an op's name decides: its item's kind (and that kind's list), whether it is a collective call, and
    whether its record holds the collective's arguments (`op_record`)."""
    name = op.name
    kind = PROCESS_ROOT if name in PROCESS_ROOT_NAMES else THREAD_ROOT if name in THREAD_ROOT_NAMES else HOST_OP
    collective_call = is_collective_call(op)
    return kind, by_kind[kind], collective_call, collective_call or name == PARAM_COMMS


def _process_root_id(ops: list[HostOp]) -> int | None:
    return next((op.id for op in ops if op.is_process_root), None)


def _device_items(kineto: KinetoTrace, device: DeviceSelection, ids: Ids) -> dict[str, list[Item]]:
    """The items of the selected runtime calls and GPU events, per kind (each in id order)."""
    events = kineto.events
    # Fresh ids (above every host id), in measured order so that ids (the simulator's issue order) follow time.
    # (start, outer before inner, runtime before GPU): the same order the thread and stream chains use.
    # (from the columns: the GPU events are the selection's `gpu`, their categories those of _GPU_KIND)
    ts, dur, gpu = events.ts, events.dur, set(device.gpu)
    chosen = device.runtime + device.gpu
    # (the keys made in C passes over the columns, not by a call per event)
    keys = sorted(zip(map(ts.__getitem__, chosen), map(operator.neg, map(dur.__getitem__, chosen)),
                      map(gpu.__contains__, chosen), chosen, strict=True))
    chosen = [key[3] for key in keys]
    is_gpu = [key[2] for key in keys]
    del keys
    new_ids = list(ids.take(len(chosen)))  # (one int object per id: the items and `id_of` share it)
    id_of = dict(zip(chosen, new_ids, strict=True))
    by_kind: dict[str, list[Item]] = {RUNTIME: [], KERNEL: [], MEMCPY: [], MEMSET: []}
    runtime, gpu_kind = by_kind[RUNTIME].append, {cat: by_kind[kind].append for cat, kind in _GPU_KIND.items()}
    launcher_of = device.launcher_of.get
    # (the events picked in C; each item made whole in one positional call, the fields in `Item`'s order)
    for i, new_id, on_gpu, ev in zip(chosen, new_ids, is_gpu, events.at(chosen), strict=True):
        args = ev.args
        start, length = ev.ts, ev.dur
        if on_gpu:  # (a category of _GPU_KIND)
            cat = ev.cat
            r = launcher_of(i)
            dev, stream = args.device, args.stream  # (as_int(x, 0), read inline where x is a plain int: most)
            gpu_kind[cat](Item(
                new_id, _GPU_KIND[cat], ev.name, start, length, length, start + length, True, None,
                dev if type(dev) is int and INT64_MIN <= dev <= INT64_MAX else as_int(dev, 0),
                stream if type(stream) is int and INT64_MIN <= stream <= INT64_MAX else as_int(stream, 0),
                None, None, kineto_args(args), None, None, None, id_of[r] if r is not None else None))
        else:
            corr = args.correlation
            runtime(Item(new_id, RUNTIME, ev.name, start, length, length, 0.0, True, ev.tid, None, None, None,
                         corr if type(corr) is int and INT64_MIN <= corr <= INT64_MAX else as_int(corr)))
    return by_kind


# The op PyTorch records a collective's metadata on (docs/FACTS.md §H7): name, group and sequence number.
PARAM_COMMS = "record_param_comms"


def op_record(op: HostOp) -> OpRecord:
    """What later stages read of a host op, decoded once: its tensors, and a collective's arguments."""
    inputs, outputs = op.inputs, op.outputs
    collective_call = is_collective_call(op)
    # positional and without a generator where there is nothing to decode: one per host op, millions in a trace
    return OpRecord(op.et_tid, op.parent, op.rf_id, op.seq_id, op.op_schema, inputs, outputs,
                    tuple(tensors(inputs.values, inputs.types)) if inputs.values else (),
                    tuple(tensors(outputs.values, outputs.types)) if outputs.values else (),
                    collective_call, _comm_args(op) if collective_call or op.name == PARAM_COMMS else None, op.fw_tid)


def _comm_args(op: HostOp) -> CommArgs:
    values = op.inputs.values
    ints = [v for v in values[1:] if isinstance(v, int) and not isinstance(v, bool)]
    peer = ints[0] if ints else 0
    tag = ints[1] if len(ints) > 1 else 0
    if op.name != PARAM_COMMS:
        return CommArgs(peer=peer, tag=tag)
    seq = values[1] if len(values) > 1 and isinstance(values[1], int) and not isinstance(values[1], bool) else None
    return CommArgs(name=_param_comms_name(op), pg_names=_param_comms_groups(op), seq=seq, peer=peer, tag=tag)


def _param_comms_name(op: HostOp) -> str | None:
    """The collective name a record_param_comms op carries (attr from 1.1.0, positional before)."""
    name = op.extra.get("collective_name")
    if isinstance(name, str) and name:
        return name
    for v in op.inputs.values[1:6]:
        if isinstance(v, str) and v and not v.startswith("<"):
            return v
    return None


def _param_comms_groups(op: HostOp) -> tuple[str, ...]:
    """The process-group names a record_param_comms op carries: the attr, then the positional one."""
    names: list[object] = [op.extra.get("pg_name")]
    v = op.inputs.values
    if len(v) >= 10 and isinstance(v[2], list) and v[2] and isinstance(v[2][0], str):
        names.append(v[2][0])
    return tuple(n for n in names if isinstance(n, str))


def kineto_args(args: Args) -> KinetoArgs | None:
    """The args later stages read, decoded (Kineto writes some numbers as strings); None when there are none."""
    name, nelems, dims, types = args.collective_name, args.in_nelems, args.input_dims, args.input_type
    if name is None and nelems is None and dims is None and types is None and args.dtype is None \
            and args.pg_name is None and args.seq is None:
        return None
    return KinetoArgs(name, as_int(nelems) if nelems is not None else None, args.dtype, args.pg_name,
                      as_int(args.seq) if args.seq is not None else None, dims if isinstance(dims, list) else None,
                      types if isinstance(types, list) else None, name is not None or nelems is not None)


def sync_record(ev: Event) -> SyncRecord:
    args = ev.args
    return SyncRecord(correlation=as_int(args.correlation), kind=args.sync_kind,
                      device=as_int(args.device, 0) or 0, stream=as_int(args.stream),
                      wait_on_stream=as_int(args.wait_on_stream), wait_on_event_corr=as_int(args.wait_on_event_corr))


def _thread_order(g: Graph) -> None:
    """Each CPU thread's program order as a chain of periods, the measured timeline cut at every op entry and exit.

    Measured items sort by entry (start, then host id or runtime order); an unmeasured host op keeps its place in
    host ET id order (ids are handed out at op entry), right after the host op before it on its thread. Each
    period belongs to the innermost open op: the first one is the op's own node; self time after a child returned
    is a SELF_PART node; time with no op open is a DELAY node (idle: Python work, data loading). Periods tile the
    thread's busy and idle time, so the chain adds up to the measured span of the thread.
    """
    roots, host, runtime = (_by_thread(g.of_kinds(kinds)) for kinds in (THREAD_ROOT_KIND, HOST_OP_KIND, RUNTIME_KIND))
    # Every thread's chain starts at the run's first measured instant, so a thread that starts late begins with
    # an idle period (explained later by a handoff where the evidence allows).
    t0 = first_measured_start(g)
    assembled = len(g.items)  # (the periods made below come after)
    for tid in _in_thread_order(roots, host, runtime):
        seq, times = _entry_order(roots.get(tid, []), host.get(tid, []), runtime.get(tid, []))
        g.threads[tid] = _Sweep(g, tid, seq, times, t0).run()
    # max(0.0, excl) is excl itself where excl > 0: most items, left out in C; the periods made are all longer than 0
    items = list(itertools.islice(g.items, assembled))
    positive = map(operator.gt, map(_EXCL, items), itertools.repeat(0.0))
    for it in itertools.compress(items, map(operator.not_, positive)):
        it.excl = max(0.0, it.excl)


def _by_thread(items: list[Item]) -> dict[int | str, list[Item]]:
    """These items (in id order) per thread, each thread's in id order; those on no thread left out. A pass in C
    per thread where there are few threads (every trace seen), else one in Python."""
    tids = list(map(_TID, items))
    threads = set(tids)
    threads.discard(None)
    if len(threads) > _FEW_THREADS:
        out: dict[int | str, list[Item]] = {}
        for tid, it in zip(tids, items, strict=True):
            if tid is not None:
                out.setdefault(tid, []).append(it)
        return out
    # (operator.eq: a thread id as an int and as a string are two threads)
    return {tid: list(itertools.compress(items, map(operator.eq, tids, itertools.repeat(tid)))) for tid in threads}


_FEW_THREADS = 16


def _entry_order(roots: list[Item], host: list[Item], runtime: list[Item]) -> tuple[list[Item], list[float]]:
    """One thread's items in entry order, and the time each one enters at: the thread's roots first (at -inf),
    then by time, at equal times host ops (by id) before runtime calls (by id: ids of runtime calls follow
    (start, longer first), see _device_items). An unmeasured host op enters at the start of the measured host op
    before it (-inf: none). A stable sort by time alone of the items so listed (floats: no key tuple per item)."""
    if all(map(_MEASURED, host)):  # (every host op of a Kineto-only conversion)
        host_times = list(map(_START, host))
    else:
        host_times, last = [], -math.inf
        for it in host:
            if it.measured:
                last = it.start
            host_times.append(last)
    body, times = host + runtime, host_times + list(map(_START, runtime))
    order = sorted(range(len(body)), key=times.__getitem__)
    return roots + list(map(body.__getitem__, order)), [-math.inf] * len(roots) + list(map(times.__getitem__, order))


def _in_thread_order(*kinds: dict[int | str, list[Item]]) -> list[int | str]:
    """The threads of these items (per kind, per thread, each thread's in id order) by name; two of one name (a
    thread id as an int and as a string) by their first item's id."""
    first: dict[int | str, int] = {}
    for by_tid in kinds:
        for tid, items in by_tid.items():
            first[tid] = min(first.get(tid, items[0].id), items[0].id)
    if len(set(map(str, first))) == len(first):  # (every trace seen: no two alike)
        return sorted(first, key=str)
    return sorted(first, key=lambda tid: (str(tid), first[tid]))


_ID, _EXCL, _START_ID = operator.attrgetter("id"), operator.attrgetter("excl"), operator.attrgetter("start", "id")
_START, _TID, _MEASURED = operator.attrgetter("start"), operator.attrgetter("tid"), operator.attrgetter("measured")


class _Sweep:
    """Cuts one thread's timeline into periods (see _thread_order)."""

    def __init__(self, g: Graph, tid: int | str, seq: list[Item], times: list[float], t0: float) -> None:
        self.g, self.tid, self.seq, self.times = g, tid, seq, times  # the items in entry order, and their entry times
        self.chain: list[int] = []
        self.stack: list[Item] = []  # the open ops, innermost last: the current period belongs to the innermost
        self.ends: list[float] = []  # their ends, in step with `stack` (an open op's start and duration stay)
        self.cursor = t0
        self.self_names: dict[str, str] = {}  # op name -> its self parts' name: one string per name, not per part
        self.parts: list[Item] = []  # the periods made, in order: added to the graph after the sweep
        self.first_id = g.ids.peek()  # the parts' ids, in order (taken from the allocator after the sweep)

    def run(self) -> list[int]:
        # The state lives in locals (the hot loop reads no attribute of self): `pending` is an op whose own node
        # period is still open, `cursor` where the current period began, `top_end` the innermost open op's end.
        stack, ends, chain, close, part = self.stack, self.ends, self.chain, self._close, self._part
        pending: Item | None = None
        cursor, top_end = self.cursor, math.inf
        for it, entry in itertools.islice(zip(self.seq, self.times, strict=True), self._place_roots(), None):
            if it.measured:  # (its start and duration read once)
                t = it.start
                dur = it.dur
            else:  # an unmeasured op is placed at its entry time, not before the cursor (max(entry, cursor))
                t = cursor if cursor > entry else entry
                dur = 0.0  # (never opened below, and overlaps nothing: every open op ends after t)
            end = t + dur
            if top_end <= t + NESTING_EPS:  # ops that ended by t close
                cursor, pending = close(t + NESTING_EPS, cursor, pending)
                top_end = ends[-1] if ends else math.inf
            # the period up to t ends: the pending op's own node, a later part of the innermost open op, or idle
            if pending is not None:  # (its own node period ends at t, not before its start: _own_end inline)
                start = pending.start
                pending.seg_end = own_end = start if start > t else t
                if own_end > cursor:
                    cursor = own_end
                pending = None
            # round(t) - round(cursor) >= 1, else shorter than the output's resolution: joins the next period (told
            # by the length alone unless it is under 2: round moves each end by at most 0.5)
            elif (length := t - cursor) >= 2.0 or (length > 0.0 and round(t) - round(cursor) >= 1):
                cursor = part(cursor, t, stack[-1] if stack else None)
            if stack:  # it began inside the innermost open op: its time is not that op's own (_enclose inline)
                parent = stack[-1]
                it.enclosing = parent.id
                overlap = (top_end if top_end < end else end) - t
                if overlap > 0.0:  # (parent.excl -= max(0.0, overlap))
                    parent.excl -= overlap
            chain.append(it.id)
            if dur > 0:
                stack.append(it)
                ends.append(top_end := end)
                pending = it
            else:
                it.start = it.seg_end = t
        close(math.inf, cursor, pending)  # (the ops still open)
        self._add_parts()
        return chain

    def _place_roots(self) -> int:
        """The thread's roots, first in its order (their keys start at -inf, before any op's), begin its chain at the
        cursor; how many there are."""
        n = 0
        for it in self.seq:
            if it.kind != THREAD_ROOT:
                break
            it.start = it.seg_end = self.cursor
            self.chain.append(it.id)
            n += 1
        return n

    def _close(self, limit: float, cursor: float, pending: Item | None) -> tuple[float, Item | None]:
        """Close the open ops that end by `limit`, innermost first, each ending the period it owned; the new
        cursor and pending op."""
        stack, ends = self.stack, self.ends
        while ends and ends[-1] <= limit:
            top, end = stack.pop(), ends.pop()
            if pending is not None:
                cursor, pending = _own_end(pending, end, cursor), None
            elif (length := end - cursor) >= 2.0 or (length > 0.0 and round(end) - round(cursor) >= 1):
                cursor = self._part(cursor, end, top)
        return cursor, pending

    def _part(self, start: float, t: float, owner: Item | None) -> float:
        """The period [start, t] as a node of its own: a later part of `owner`, or idle time with no op open.
        Returns its end: the new cursor."""
        parts = self.parts
        part_id = self.first_id + len(parts)
        length = t - start  # (its duration and exclusive time: one float object for both)
        if owner is not None:
            name = self.self_names.get(owner.name)
            if name is None:
                name = self.self_names[owner.name] = f"{owner.name} [self]"
            # (positional, in `Item`'s order: fewer steps than by keyword)
            parts.append(Item(part_id, SELF_PART, name, start, length, length, t, True, self.tid, None, None, None,
                              None, None, None, None, None, None, None, 0, owner.id))
        else:
            parts.append(Item(part_id, DELAY, "[idle]", start, length, length, t, True, self.tid))
        self.chain.append(part_id)
        return t

    def _add_parts(self) -> None:
        """The periods made join the graph, their ids taken (what `Graph.add` does one by one)."""
        g, parts = self.g, self.parts
        ids = g.ids.take(len(parts))
        assert ids.start == self.first_id, "nothing takes ids while a thread is swept"
        g.items.extend(parts)
        g.by_id.update(zip(map(_ID, parts), parts, strict=True))  # (keyed by each part's own id object)


def _own_end(pending: Item, t: float, cursor: float) -> float:
    """The pending op's own node period ends at t (not before its start); the new cursor."""
    start = pending.start
    pending.seg_end = end = start if start > t else t  # (max(t, start))
    return end if end > cursor else cursor


def _stream_order(g: Graph) -> None:
    streams: dict[tuple[int, int], list[Item]] = defaultdict(list)
    for it in g.of_kinds(GPU_KINDS):
        streams[(it.device or 0, it.stream or 0)].append(it)
    for key in sorted(streams):
        ops = streams[key]  # (in id order: in (start, id) order already unless a start goes back)
        starts = list(map(_START, ops))
        if not all(map(operator.le, starts, starts[1:])):
            ops.sort(key=_START_ID)
        g.streams[key] = list(map(_ID, ops))
