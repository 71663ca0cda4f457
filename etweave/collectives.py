"""Find the collective calls and make each one a communication item: the NCCL kernel on the GPU path, the `gloo:*`
op that does the work on the gloo path. Type and size come from the host ET first, Kineto args next, the
enclosing op, and the kernel name last (counted as a fallback)."""

from __future__ import annotations

import bisect
import math
import operator
import re
from collections import Counter
from collections.abc import Callable

import msgspec
from msgspec import field

from etweave.chakra import schema
from etweave.chakra.accepts import SIMULATOR_MAPPING, comm_type_name
from etweave.errors import BadInput
from etweave.model import HOST_OP, HOST_OP_KIND, KERNEL, Comm, Graph, Item, OpRecord
from etweave.read import widths
from etweave.repair import COLLECTIVE_CALL_PREFIX

SEND, RECV = "send", "recv"
# How many calls back a gloo op's call may be: async calls (DDP buckets) can be open several at a time.
_OPEN_CALLS = 16

# Checked in order: the first pattern found in the normalized name decides.
_PATTERNS: list[tuple[str, int | str | None]] = [
    ("sendrecv", None),  # NCCL's SendRecv kernel serves all_to_all and p2p alike: ambiguous by itself
    ("reducescatter", schema.REDUCE_SCATTER),
    ("allreduce", schema.ALL_REDUCE),
    ("allgather", schema.ALL_GATHER),
    ("alltoall", schema.ALL_TO_ALL),
    ("broadcast", schema.BROADCAST),
    ("barrier", schema.BARRIER),
    ("reduce", schema.REDUCE),
    ("gather", schema.GATHER),
    ("scatter", schema.SCATTER),
    ("send", SEND),
    ("recv", RECV),
]

_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
                "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "byte": 1, "uint8": 1, "char": 1,
                "int8": 1, "signed char": 1, "bool": 1, "short": 2, "int16": 2, "c10::half": 2,
                "c10::bfloat16": 2, "unsigned char": 1}

# c10d ops whose position-1 argument is the input (output first); all others take their input at position 0.
_INPUT_AT_1 = ("_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_", "_reduce_scatter_base_",
               "reduce_scatter_", "reduce_scatter_tensor_coalesced_", "alltoall_base_", "alltoall_", "gather_",
               "scatter_", "allgather_coalesced_")


def classify(name: str) -> int | str | None:
    """The collective type a name denotes: an int CollectiveCommType, SEND/RECV, or None when unknown."""
    norm = re.sub(r"[^a-z]", "", name.lower().split("(")[0])
    for prefix in ("c10d", "nccldevkernel", "ncclkernel", "nccl", "gloo", "rccl"):
        if norm.startswith(prefix):
            norm = norm[len(prefix):]
            break
    for pattern, kind in _PATTERNS:
        if pattern in norm:
            return kind
    return None


def is_nccl_kernel(it: Item) -> bool:
    return it.kind == KERNEL and _is_nccl_name(it.name)


def _is_nccl_name(name: str) -> bool:
    return "nccl" in name[:24].lower() or "rccl" in name[:24].lower()


class CollectiveStats(msgspec.Struct):
    calls: int = 0  # collective calls in the input
    comm_nodes: int = 0
    unmatched_calls: list[Item] = field(default_factory=list)  # calls with no work in the window
    mapped: Counter[str] = field(default_factory=Counter)  # "barrier->ALL_REDUCE"
    type_fallbacks: Counter[str] = field(default_factory=Counter)  # where a type came from kernel name or default
    size_unknown: int = 0
    coalesced_without_metadata: int = 0  # NCCL kernels of a coalesced group that carry no Kineto args


COMM_MADE_OF = frozenset({HOST_OP, KERNEL})  # the items a comm node may be made of (gloo ops, kernels)
_KERNEL = frozenset({KERNEL})
_ID = operator.attrgetter("id")


def find_collectives(g: Graph, groups: dict[str, str]) -> CollectiveStats:
    """Mark comm items in place. `groups` maps a trace's process-group name to its comm-group id ("" = world)."""
    stats = CollectiveStats()
    # host ops and kernels told by name, once per distinct name; those of other names left out in C (most)
    host_ops, kernels = g.of_kinds(HOST_OP_KIND), g.of_kinds(_KERNEL)
    host_names = {it.name for it in host_ops}
    c10d = {n for n in host_names if n.startswith(COLLECTIVE_CALL_PREFIX)}  # (no other name is a call)
    calls = [it for it in host_ops if it.name in c10d and it.host is not None and it.host.collective_call]
    paired: set[int] = set()
    calls_by_thread: dict[int, list[Item]] = {}
    for c in calls:
        calls_by_thread.setdefault(c.host.et_tid if c.host else 0, []).append(c)
    gloo = {n for n in host_names if n.startswith("gloo:")}
    nccl_names = {n for n in {it.name for it in kernels} if _is_nccl_name(n)}
    # the gloo ops and NCCL kernels, in item order (ids)
    for it in sorted([*(it for it in host_ops if it.name in gloo), *(it for it in kernels if it.name in nccl_names)],
                     key=_ID):
        if it.kind == HOST_OP and it.name.startswith("gloo:"):
            assert it.host is not None
            # Without a host ET (Kineto only) a gloo op sits on its worker thread, not the issuing one: then
            # its call is among every thread's calls.
            call = _gloo_call(calls_by_thread.get(it.host.et_tid, []), it, paired) or _gloo_call(calls, it, paired)
            _make_comm(g, it, call, groups, stats)
        elif it.kind == KERNEL and it.name in nccl_names:
            call = _enclosing(g, it, lambda h: h.kind == HOST_OP and _is_call(h))
            if call is not None:
                paired.add(call.id)
            _make_comm(g, it, call, groups, stats)
    stats.unmatched_calls = [c for c in calls if c.id not in paired]
    stats.calls = stats.comm_nodes + len(stats.unmatched_calls)
    return stats


def _is_call(it: Item) -> bool:
    return it.host is not None and it.host.collective_call


def _gloo_call(calls: list[Item], gloo: Item, paired: set[int]) -> Item | None:
    """The c10d call a gloo op works for, among the unpaired calls entered before it on the issuing thread.

    The host ET's parent of a gloo op is often not its c10d op (docs/FACTS.md §H8), but ids are handed out at op entry,
    so the call comes before its gloo op on the issuing thread's counter. Async calls (DDP buckets) can have
    several open at once: the one whose input tensor the gloo op works on is it; else the oldest of the same
    kind, since a process group runs its work in issue order. `calls` are in id order.
    """
    assert gloo.host is not None
    pos = bisect.bisect_left(calls, gloo.id, key=lambda c: c.id)
    open_calls = [c for c in calls[max(0, pos - _OPEN_CALLS):pos] if c.id not in paired]
    if not open_calls:
        return None
    wanted = {(t, s) for _, t, s, _, _ in gloo.host.input_tensors}
    kind = classify(gloo.name)

    def same_tensor(c: Item) -> bool:
        assert c.host is not None
        return any((t, s) in wanted for _, t, s, _, _ in c.host.input_tensors)

    def same_kind(c: Item) -> bool:
        # reduce_scatter_tensor runs as gloo:all_reduce (docs/FACTS.md §H8)
        return classify(c.name) == kind or (kind == schema.ALL_REDUCE and classify(c.name) == schema.REDUCE_SCATTER)

    call = next((c for c in open_calls if wanted and same_tensor(c)), None) \
        or next((c for c in open_calls if same_kind(c)), None) or open_calls[0]
    paired.add(call.id)
    return call


def _enclosing(g: Graph, it: Item, want: Callable[[Item], bool]) -> Item | None:
    """Walk from a GPU item's launcher up the enclosing chain (time containment on the launching thread)."""
    cur = g.by_id.get(it.launcher) if it.launcher is not None else None
    while cur is not None:
        if want(cur):
            return cur
        cur = g.by_id.get(cur.enclosing) if cur.enclosing is not None else None
    return None


def _param_comms(g: Graph, it: Item) -> Item | None:
    return _enclosing(g, it, lambda h: h.name == "record_param_comms" and h.kind == HOST_OP
                      and _rpc_name(h) not in ("wait", None))


def _rpc_name(it: Item) -> str | None:
    """The collective name a record_param_comms op carries: in the host ET, else in its Kineto args."""
    comm = it.host.comm if it.host is not None else None
    if comm is not None and comm.name is not None:
        return comm.name
    if it.kineto is not None and it.kineto.collective_name:
        return it.kineto.collective_name
    return None


def _make_comm(g: Graph, it: Item, call: Item | None, groups: dict[str, str], stats: CollectiveStats) -> None:
    rpc = _param_comms(g, it) if it.kind == KERNEL else None
    annotation = _enclosing(g, it, lambda h: h.name.startswith("nccl:")) if it.kind == KERNEL else None
    kind, source, name = _comm_type(it, call, rpc, annotation)
    if source in ("kernel_name", "default"):
        stats.type_fallbacks[source] += 1
    if it.kind == KERNEL and (it.kineto is None or not it.kineto.collective_args) \
            and _enclosing(g, it, lambda h: "coalesced" in h.name.lower()) is not None:
        # one kernel for a whole group (`nccl:coalesced`): its type and size are a guess, say so
        stats.coalesced_without_metadata += 1
    size = _size(call, rpc, it, annotation)
    if size is not None and not 0 <= size <= widths.INT64_MAX:
        # tensor sizes that multiply past what comm_size holds: the input is corrupt, say where
        op = call or rpc or it
        raise BadInput(_input_file(g, op), f"node {op.id} {op.name!r}: collective size {size} bytes out of range "
                                           "(from the tensor sizes of its inputs)")
    if size is None:
        stats.size_unknown += 1
        size = 0
    pg = _pg_name(call, rpc, it, groups, g)
    seq = _seq(rpc, it)
    short = _short_name(name)
    if kind in (SEND, RECV):
        it.comm = _p2p(g, call or rpc, kind == SEND, Comm(0, short, 0, size, pg, seq, type_source=source))
    else:
        assert isinstance(kind, int)
        written = SIMULATOR_MAPPING.get(kind, kind)
        if written != kind:
            stats.mapped[f"{comm_type_name(kind)}->{comm_type_name(written)}"] += 1
        it.comm = Comm(schema.COMM_COLL_NODE, short, written, size, pg, seq, type_source=source)
    stats.comm_nodes += 1


def _comm_type(it: Item, call: Item | None, rpc: Item | None, annotation: Item | None) -> tuple[int | str, str, str]:
    """The collective type, where it came from and the name it came from: the first name that denotes one."""
    candidates: list[tuple[str, str | None]] = [
        ("host", call.name if call is not None else None),
        ("host", _rpc_name(rpc) if rpc is not None else None),
        ("kineto_args", it.kineto.collective_name if it.kineto is not None else None),
        ("enclosing_op", annotation.name if annotation is not None else None),
        ("enclosing_op", it.name if it.kind == HOST_OP else None),  # gloo:all_reduce names its own type
        ("kernel_name", it.name if it.kind == KERNEL else None),
    ]
    for source, name in candidates:
        if name:
            kind = classify(name)
            if kind is not None:
                return kind, source, name
    return schema.ALL_REDUCE, "default", "unknown"


def _p2p(g: Graph, op: Item | None, send: bool, comm: Comm) -> Comm:
    """A send or recv between this rank and the peer its call names (checked against the output's widths)."""
    peer, tag = _peer_and_tag(op)
    if op is not None:
        widths.rank(_input_file(g, op), f"node {op.id} {op.name!r}: peer", peer)
        if not widths.INT32_MIN <= tag <= widths.INT32_MAX:
            raise BadInput(_input_file(g, op), f"node {op.id} {op.name!r}: tag {tag} out of range (int32)")
    me = g.rank
    comm.node_type = schema.COMM_SEND_NODE if send else schema.COMM_RECV_NODE
    comm.src, comm.dst = (me, peer) if send else (peer, me)
    comm.tag = tag
    return comm


def _input_file(g: Graph, it: Item) -> str:
    """The file an item's fields came from, for messages about bad input."""
    return (g.files.host if it.host is not None else "") or g.files.device or "input"


def _short_name(name: str) -> str:
    for prefix in ("c10d::", "nccl:", "gloo:"):
        if name.startswith(prefix):
            return name[len(prefix):].strip("_")
    return name.split("(")[0]


def _tensor_bytes(op: OpRecord, position: int | None) -> int | None:
    found = [(pos, n * b) for pos, _, _, n, b in op.input_tensors]
    if not found:
        return None
    if position is not None:
        at = [nb for pos, nb in found if pos == position]
        if at:
            return sum(at)
    return sum(nb for pos, nb in found if pos == found[0][0])


def _dims_bytes(it: Item | None, position: int) -> int | None:
    """Bytes of the tensor at `position` from the Kineto `Input Dims` / `Input type` of the item's event."""
    args = it.kineto if it is not None else None
    if args is None or args.input_dims is None or args.input_type is None:
        return None
    if position >= min(len(args.input_dims), len(args.input_type)):
        return None
    dims, dtype = args.input_dims[position], args.input_type[position]
    elem = _DTYPE_BYTES.get(dtype.lower()) if isinstance(dtype, str) else None
    if elem is None or not isinstance(dims, list) or not all(isinstance(d, int) and d >= 0 for d in dims):
        return None  # a TensorList or a scalar: no usable shape
    return math.prod(dims) * elem


def _size(call: Item | None, rpc: Item | None, it: Item, annotation: Item | None = None) -> int | None:
    size = _recorded_size(call, rpc, it)
    if size is not None:
        return size
    # Kineto-only (or a host ET without tensors): the shapes Kineto recorded: the call's input, else what the
    # `nccl:*` op (or the gloo op itself) was given
    call_input = 1 if call is not None and call.name[6:] in _INPUT_AT_1 else 0
    for src, position in ((call, call_input), (annotation, 0), (it if it.kind == HOST_OP else None, 0)):
        size = _dims_bytes(src, position)
        if size is not None:
            return size
    return None


def _recorded_size(call: Item | None, rpc: Item | None, it: Item) -> int | None:
    """Bytes from the host ET's tensors of the call or its record_param_comms op, Kineto's element count and
    dtype, or the gloo op's own input tensor, in that order."""
    if call is not None and call.host is not None:
        base = call.name[6:]
        size = _tensor_bytes(call.host, 1 if base in _INPUT_AT_1 else 0)
        if size is not None:
            return size
    if rpc is not None and rpc.host is not None:
        size = _tensor_bytes(rpc.host, None)
        if size is not None:
            return size
    for src in (it, rpc):
        args = src.kineto if src is not None else None
        if args is not None and args.in_nelems is not None and args.dtype:
            return args.in_nelems * _DTYPE_BYTES.get(args.dtype.lower(), 4)
    if it.host is not None:  # gloo op: its own input tensor
        return _tensor_bytes(it.host, None)
    return None


def _pg_name(call: Item | None, rpc: Item | None, it: Item, groups: dict[str, str], g: Graph | None = None) -> str:
    names: list[str | None] = []
    if g is not None and call is not None:  # etweave.collect's annotation around the call (gloo has no other)
        names.append(_annotated_group(g, call))
    if rpc is not None and rpc.host is not None and rpc.host.comm is not None:
        names.extend(rpc.host.comm.pg_names)
    for src in (it, rpc):
        if src is not None and src.kineto is not None:
            names.append(src.kineto.pg_name)
    for name in names:
        if isinstance(name, str) and name in groups:
            return groups[name]
    return ""


_PG_PREFIX, _PG_SUFFIX = "## etweave:process_group ", " ##"


def _annotated_group(g: Graph, call: Item) -> str | None:
    """The group name of the nearest `## etweave:process_group <name> ##` op above `call` in the host ET tree."""
    cur: Item | None = call
    for _ in range(64):  # the annotation is the call's parent; a bound keeps a damaged tree from looping
        if cur is None:
            break
        if cur.name.startswith(_PG_PREFIX) and cur.name.endswith(_PG_SUFFIX):
            return cur.name[len(_PG_PREFIX):-len(_PG_SUFFIX)]
        cur = g.by_id.get(cur.parent) if cur.parent is not None else None
    return None


def _seq(rpc: Item | None, it: Item) -> int | None:
    for src in (it, rpc):
        if src is not None and src.kineto is not None and src.kineto.seq is not None:
            return src.kineto.seq
    if rpc is not None and rpc.host is not None and rpc.host.comm is not None:
        return rpc.host.comm.seq
    return None


def _peer_and_tag(call: Item | None) -> tuple[int, int]:
    comm = call.host.comm if call is not None and call.host is not None else None
    return (comm.peer, comm.tag) if comm is not None else (0, 0)
