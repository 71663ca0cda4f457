"""The evidence sources read from the graph's structure: each `(Graph) -> list[Edge]`, one `Evidence` each (each
wait source is in its own module, with its finder)."""

from __future__ import annotations

import itertools
import operator
from collections import defaultdict

from etweave.chakra import schema
from etweave.deps.awaited import awaited
from etweave.deps.evidence import WAIT_TOLERANCE, Evidence
from etweave.model import (
    GPU_KINDS,
    HOST_OP_KIND,
    KERNEL,
    PROCESS_ROOT_KIND,
    THREAD_ROOT_KIND,
    Edge,
    Graph,
    Item,
)


def thread_order(g: Graph) -> list[Edge]:
    """Ops on one CPU thread run one after another in measured order; each thread root follows the process root."""
    edges: list[Edge] = []
    for order in g.threads.values():
        edges.extend(map(Edge, order, order[1:], itertools.repeat(Evidence.THREAD_ORDER)))  # (pairwise, in C)
    roots = g.of_kinds(PROCESS_ROOT_KIND)
    if roots:
        root = roots[0].id
        edges.extend(Edge(root, it.id, Evidence.THREAD_ORDER) for it in g.of_kinds(THREAD_ROOT_KIND))
    return edges


def launch(g: Graph) -> list[Edge]:
    """A runtime launch call -> the GPU event it launched (Kineto correlation), and -> the idle time on the stream
    before that event (it began once the launch was done)."""
    items = g.of_kinds(GPU_KINDS)  # (only GPU ops are launched)
    # (a comprehension: an attrgetter in C costs twice its step per item)
    return [*[Edge(it.launcher, it.id, Evidence.LAUNCH) for it in items if it.launcher is not None],
            *awaited(g, Evidence.LAUNCH)]


_KERNEL = frozenset({KERNEL})
_START_ID, _START_POS_ID = operator.attrgetter("start", "id"), operator.attrgetter("start", "pos", "id")


def stream_order(g: Graph) -> list[Edge]:
    """Events on one (device, stream) run in measured order."""
    edges: list[Edge] = []
    for order in g.streams.values():
        edges.extend(map(Edge, order, order[1:], itertools.repeat(Evidence.STREAM_ORDER)))
    return edges


def autograd(g: Graph) -> list[Edge]:
    """Backward ops after the forward op they belong to. Each thread counts sequence numbers from 0, so the host ET
    names the forward op's thread (`fw_tid` of a backward op): a backward op follows the op of its sequence number
    on that thread (the earliest, not itself a backward op), when it runs on another thread and started after that
    op ended. A trace that names no forward thread (Kineto alone) pairs by sequence number on any other thread."""
    seq_ops = [it for it in g.of_kinds(HOST_OP_KIND)
               if it.host is not None and it.host.seq_id >= 0 and it.tid is not None]
    if not any(it.host is not None and it.host.fw_tid for it in seq_ops):
        return _autograd_any_thread(seq_ops)
    forward: dict[tuple[int, int], Item] = {}  # (ET thread, sequence number) -> its forward op
    backward: dict[tuple[int, int], list[Item]] = defaultdict(list)
    for it in sorted(seq_ops, key=_START_ID):
        h = it.host
        assert h is not None
        if h.fw_tid:
            backward[(h.fw_tid, h.seq_id)].append(it)
        else:
            forward.setdefault((h.et_tid, h.seq_id), it)
    edges: list[Edge] = []
    for key in sorted(backward):
        fwd = forward.get(key)
        if fwd is None:
            continue
        ops = backward[key]
        ids = {fwd.id, *(it.id for it in ops)}
        edges.extend(Edge(fwd.id, it.id, Evidence.AUTOGRAD) for it in ops
                     if it.tid != fwd.tid and it.enclosing not in ids and it.start >= fwd.start + fwd.dur)
    return edges


def _autograd_any_thread(seq_ops: list[Item]) -> list[Edge]:
    """Without forward thread ids: the earliest op of a sequence number is the forward op, and ops of that number
    on other threads that started after it ended are its backward ops."""
    by_seq: dict[int, list[Item]] = defaultdict(list)
    for it in seq_ops:
        assert it.host is not None
        by_seq[it.host.seq_id].append(it)
    edges: list[Edge] = []
    for seq in sorted(by_seq):
        ops = sorted(by_seq[seq], key=_START_ID)
        fwd = ops[0]
        ids = {it.id for it in ops}
        edges.extend(Edge(fwd.id, it.id, Evidence.AUTOGRAD) for it in ops[1:]
                     if it.tid != fwd.tid and it.enclosing not in ids and it.start >= fwd.start + fwd.dur)
    return edges


def tensor_flow(g: Graph) -> list[Edge]:
    """An op that reads a tensor after an op on another thread wrote it (same tensor and storage id).

    Same-thread producers are already before their consumers in program order, so only cross-thread flows add
    an edge (this places an all_reduce on a comm thread after the loss that produced its input)."""
    writer: dict[tuple[int, int], Item] = {}
    edges: list[Edge] = []
    # (ops that read or write no tensor take no part: left out before the sort; a Kineto op records none)
    ops = sorted([it for it in g.of_kinds(HOST_OP_KIND)
                  if it.host is not None and (it.host.input_tensors or it.host.output_tensors)], key=_START_POS_ID)
    for it in ops:
        h = it.host
        assert h is not None
        for _, tensor, storage, _, _ in h.input_tensors:
            w = writer.get((tensor, storage))
            if w is not None and w.tid != it.tid:
                edges.append(Edge(w.id, it.id, Evidence.TENSOR_FLOW))
        for _, tensor, storage, _, _ in h.output_tensors:
            writer[(tensor, storage)] = it
    return edges


def collective_order(g: Graph) -> list[Edge]:
    """Collectives of one process group complete in issue order (`Seq` where the trace has it, else start time)."""
    groups: dict[str, list[Item]] = defaultdict(list)
    # (comm items are gloo ops and kernels, picked in C; each group is sorted on a key with the id in it, so the
    # order they are found in does not matter)
    for of_kind in (g.of_kinds(HOST_OP_KIND), g.of_kinds(_KERNEL)):
        for it in [it for it in of_kind if it.comm is not None]:
            comm = it.comm
            assert comm is not None  # (picked so)
            if comm.node_type == schema.COMM_COLL_NODE:
                groups[comm.pg_name].append(it)
    edges: list[Edge] = []
    for pg in sorted(groups):
        ops = sorted(groups[pg], key=lambda it: (it.comm.seq if it.comm and it.comm.seq is not None else -1,
                                                 it.start, it.id))
        # An edge says "b starts after a is done": collectives that overlapped (gloo runs one group's work on
        # several worker threads) were ordered at issue, on the issuing thread, not at completion.
        edges.extend(Edge(a.id, b.id, Evidence.COLLECTIVE_ORDER) for a, b in itertools.pairwise(ops)
                     if a.start + a.dur <= b.start + WAIT_TOLERANCE)
    return edges
