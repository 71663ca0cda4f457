"""Stage 4, assemble: one item per future node (host ops, thread roots, runtime calls, GPU events), each CPU
thread's program order with exclusive durations from time containment, and each GPU stream's order."""

from __future__ import annotations

from collections import defaultdict

from etweave.link import DeviceSelection, HostLink
from etweave.model import (
    GPU_KINDS,
    HOST_OP,
    KERNEL,
    MEMCPY,
    MEMSET,
    PROCESS_ROOT,
    RUNTIME,
    THREAD_ROOT,
    Graph,
    Item,
)
from etweave.read.host_et import HostTrace
from etweave.read.kineto import KinetoTrace, as_int
from etweave.repair import Repair

_GPU_KIND = {"kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
             "gpu_memset": MEMSET, "Memset": MEMSET}
# Kineto rounds to the µs on old traces: a child may seem to end a hair after its parent.
_EPS = 1e-3


def assemble(host: HostTrace | None, kineto: KinetoTrace | None, link: HostLink, device: DeviceSelection | None,
             rep: Repair | None, next_id: int, rank: int) -> Graph:
    items: list[Item] = []
    if host is not None and rep is not None:
        items.extend(_host_items(host, kineto, link, rep))
    if kineto is not None and device is not None:
        items.extend(_device_items(kineto, device, next_id, items))
    items.sort(key=lambda it: it.id)
    g = Graph(items=items, by_id={it.id: it for it in items}, rank=rank)
    _thread_order(g)
    _stream_order(g)
    return g


def _host_items(host: HostTrace, kineto: KinetoTrace | None, link: HostLink, rep: Repair) -> list[Item]:
    events = kineto.events if kineto is not None else []
    items: list[Item] = []
    for op in host.ops:
        kind = PROCESS_ROOT if op.is_process_root else THREAD_ROOT if op.is_thread_root else HOST_OP
        it = Item(id=op.id, kind=kind, name=op.name, host=op, parent=rep.parent_of.get(op.id),
                  orphan_parent=rep.orphan_parent.get(op.id))
        i = link.event_of.get(op.id)
        if i is not None:
            ev = events[i]
            it.event, it.start, it.dur, it.excl, it.measured, it.tid = ev, ev.ts, ev.dur, ev.dur, True, ev.tid
        elif kind != PROCESS_ROOT:
            it.tid = link.kthread_of.get(op.et_tid, op.et_tid)
        items.append(it)
    for et_tid, root_id in sorted(rep.synthesized_roots.items()):
        items.append(Item(id=root_id, kind=THREAD_ROOT, name=f"[etweave|synthesized|thread {et_tid}]",
                          tid=link.kthread_of.get(et_tid, et_tid), parent=_process_root_id(host)))
    return items


def _process_root_id(host: HostTrace) -> int | None:
    return next((op.id for op in host.ops if op.is_process_root), None)


def _device_items(kineto: KinetoTrace, device: DeviceSelection, next_id: int, host_items: list[Item]) -> list[Item]:
    events = kineto.events
    # Fresh ids above every host id, in measured order so that ids (the simulator's issue order) follow time.
    # (start, outer before inner, runtime before GPU): the same order the thread and stream chains use.
    chosen = sorted(device.runtime + device.gpu, key=lambda i: (events[i].ts, -events[i].dur, events[i].cat in _GPU_KIND, i))
    start_id = max([next_id, *(it.id + 1 for it in host_items)])
    id_of = {i: start_id + n for n, i in enumerate(chosen)}
    items: list[Item] = []
    for i in chosen:
        ev = events[i]
        if ev.cat in _GPU_KIND:
            it = Item(id=id_of[i], kind=_GPU_KIND[ev.cat], name=ev.name, start=ev.ts, dur=ev.dur, excl=ev.dur,
                      measured=True, event=ev, device=as_int(ev.args.device, 0), stream=as_int(ev.args.stream, 0))
            r = device.launcher_of.get(i)
            it.launcher = id_of[r] if r is not None else None
        else:
            it = Item(id=id_of[i], kind=RUNTIME, name=ev.name, start=ev.ts, dur=ev.dur, excl=ev.dur,
                      measured=True, event=ev, tid=ev.tid)
        items.append(it)
    return items


def _thread_order(g: Graph) -> None:
    """Program order per CPU thread and exclusive durations by time containment.

    Measured items sort by start (outer before inner at equal starts); an unmeasured host op keeps its place in
    host ET id order (ids are handed out at op entry), right after the host op before it on its thread.
    """
    keyed: dict[int | str, list[tuple[tuple[float, int, float, float], Item]]] = defaultdict(list)
    last_ts: dict[int | str, float] = {}
    for it in g.items:  # id order
        if it.tid is None or it.kind in GPU_KINDS or it.comm is not None and it.kind in GPU_KINDS:
            continue
        if it.kind == THREAD_ROOT:  # first on its thread, whatever its id
            keyed[it.tid].append(((float("-inf"), -1, it.id, 0.0), it))
        elif it.kind == HOST_OP:
            rank = 0
            ts = it.start if it.measured else last_ts.get(it.tid, float("-inf"))
            if it.measured:
                last_ts[it.tid] = ts
            keyed[it.tid].append(((ts, rank, it.id, 0.0), it))  # host ids are entry order
        elif it.kind == RUNTIME:
            keyed[it.tid].append(((it.start, 1, -it.dur, it.id), it))
    for tid in sorted(keyed, key=str):
        seq = sorted(keyed[tid], key=lambda kv: kv[0])
        first_start = next((it.start for _, it in seq if it.measured), 0.0)
        placed = {it.id: max(key[0], first_start) for key, it in seq}
        order = [it.id for _, it in seq]
        g.threads[tid] = order
        stack: list[Item] = []
        for _, it in seq:
            if it.kind == THREAD_ROOT:
                continue
            if not it.measured:
                if stack:
                    it.enclosing = stack[-1].id
                it.start = placed[it.id]  # where the op before it started (or where the thread starts)
                continue
            while stack and stack[-1].start + stack[-1].dur <= it.start + _EPS:
                stack.pop()
            if stack:
                parent = stack[-1]
                it.enclosing = parent.id
                parent.excl -= max(0.0, min(it.start + it.dur, parent.start + parent.dur) - it.start)
            stack.append(it)
    # Thread roots sit where their thread starts.
    for order in g.threads.values():
        first = next((g.by_id[i] for i in order if g.by_id[i].measured), None)
        for i in order:
            it = g.by_id[i]
            if it.kind == THREAD_ROOT and first is not None:
                it.start = first.start
    for it in g.items:
        it.excl = max(0.0, it.excl)


def _stream_order(g: Graph) -> None:
    streams: dict[tuple[int, int], list[Item]] = defaultdict(list)
    for it in g.items:
        if it.kind in GPU_KINDS:
            streams[(it.device or 0, it.stream or 0)].append(it)
    for key in sorted(streams):
        g.streams[key] = [it.id for it in sorted(streams[key], key=lambda it: (it.start, it.id))]
