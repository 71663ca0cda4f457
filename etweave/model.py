"""The plain data the stages pass along: items (future nodes), edges with their evidence, and the graph.

The records made per op, event or edge are `gc=False` Structs: the cyclic collector never tracks them (16 bytes
less each, built faster). That is safe because none can be part of a reference cycle: they hold numbers,
strings, tuples, each other by id, and lists of records that hold none of them back.
"""

from __future__ import annotations

import itertools
import operator
from typing import TYPE_CHECKING

import msgspec

from etweave.read.host_et import IO

if TYPE_CHECKING:  # annotations only: etweave.deps imports this module
    from etweave.deps.evidence import Evidence

# Item kinds. A kind decides the node type and attrs when nodes are built.
PROCESS_ROOT, THREAD_ROOT, HOST_OP, RUNTIME = "process_root", "thread_root", "host_op", "runtime"
KERNEL, MEMCPY, MEMSET, DELAY = "kernel", "gpu_memcpy", "gpu_memset", "delay"
# Later self time of an op (after a child returned), and what a blocking call did once its wait was over.
SELF_PART, RESUME = "self_part", "resume"
# The measured latency of a thread waking up after what it waited for ended (it follows the wait edge), and time a
# thread spent with no op open that no evidence says it waited in: code the profiler did not record.
WAKEUP, UNTRACED = "wakeup", "untraced"
GPU_KINDS = frozenset({KERNEL, MEMCPY, MEMSET})
# The kinds only assemble makes: no later stage adds, removes or changes an item of these (`Graph.of_kinds`).
ASSEMBLED_KINDS = frozenset({PROCESS_ROOT, THREAD_ROOT, HOST_OP, RUNTIME, *GPU_KINDS})
# Kineto rounds to the µs on old traces: a child may seem to end a hair after its parent. Ends this close (µs) are
# taken as one moment when nesting ops by time.
NESTING_EPS = 1e-3


class Comm(msgspec.Struct, gc=False):
    """What makes an item a communication node."""

    node_type: int  # COMM_COLL_NODE, COMM_SEND_NODE or COMM_RECV_NODE
    collective_name: str  # as the trace names it: allreduce, all_to_allv, barrier, send ...
    comm_type: int  # CollectiveCommType written (after mapping unsupported types)
    size: int  # bytes
    pg_name: str = ""  # "" = all ranks
    seq: int | None = None
    src: int | None = None
    dst: int | None = None
    tag: int | None = None
    type_source: str = ""  # where the type came from: host, kineto_args, enclosing_op, kernel_name
    # µs its record stayed open after the collective completed (a waiter resumed first, docs/FACTS.md §W3): the
    # item's `dur` then ends at the completion, and a `[record tail]` period of it on its thread holds the rest
    record_tail: float = 0.0


# A tensor among an op's inputs or outputs: (position, tensor id, storage id, elements, bytes per element).
TensorRef = tuple[int, int, int, int, int]


class CommArgs(msgspec.Struct, frozen=True, gc=False):
    """What a collective call (`c10d::*`) or its `record_param_comms` op records about the collective."""

    name: str | None = None  # record_param_comms: the collective's name (attr from 1.1.0, positional before)
    pg_names: tuple[str, ...] = ()  # record_param_comms: its process group's name, as attr then positional
    seq: int | None = None  # record_param_comms: the collective's sequence number (positional)
    peer: int = 0  # send/recv: the first integer argument after the tensor
    tag: int = 0  # send/recv: the second


class OpRecord(msgspec.Struct, gc=False):
    """The host op an item stands for, decoded once when items are built: what later stages read of it."""

    et_tid: int  # the host ET's thread id
    et_parent: int  # the host ET's parent id (before repair)
    rf_id: int
    seq_id: int  # autograd sequence number, -1: none
    op_schema: str
    inputs: IO  # as recorded: written to the node unchanged; shapes and types give the roofline its work
    outputs: IO
    input_tensors: tuple[TensorRef, ...]
    output_tensors: tuple[TensorRef, ...]
    collective_call: bool = False  # a c10d collective or p2p call (not `wait`, not process-group bookkeeping)
    comm: CommArgs | None = None  # collective calls and record_param_comms ops only
    fw_tid: int = 0  # a backward op: the host ET thread id of its forward op's thread (0: a forward op, or unknown)


class KinetoArgs(msgspec.Struct, gc=False):
    """The Kineto `args` of an item's event that later stages read (collective metadata, input shapes), decoded
    once when items are built. Events without any of them carry none."""

    collective_name: str | None = None
    in_nelems: int | None = None  # elements of the collective's input
    dtype: str | None = None
    pg_name: str | None = None
    seq: int | None = None
    input_dims: list[object] | None = None  # per input: its shape (a list of ints) or something else
    input_type: list[object] | None = None  # per input: its dtype name
    collective_args: bool = False  # the event records `Collective name` or `In msg nelems` (even unreadable)


class SyncRecord(msgspec.Struct, frozen=True, gc=False):
    """A Kineto `cuda_sync` event, decoded: which stream or CUDA event a synchronizing runtime call waited on."""

    correlation: int | None  # of the runtime call it describes
    kind: str | None  # "Stream Sync", "Event Sync", "Stream Wait Event" ...
    device: int
    stream: int | None
    wait_on_stream: int | None  # the stream the waited-on CUDA event was recorded on
    wait_on_event_corr: int | None  # the correlation of the cudaEventRecord call that recorded it


class Item(msgspec.Struct, gc=False):
    id: int
    kind: str
    name: str
    start: float = 0.0  # µs, measured (or placed, when not measured)
    dur: float = 0.0  # inclusive measured duration, µs
    excl: float = 0.0  # exclusive time by time containment (all of the op's self time)
    seg_end: float = 0.0  # end of this node's own period on its thread: its duration is seg_end - start
    measured: bool = False
    tid: int | str | None = None  # CPU thread the item ran on
    device: int | None = None
    stream: int | None = None
    host: OpRecord | None = None  # the host op (host ET node, or a Kineto cpu op standing in for one)
    correlation: int | None = None  # runtime calls: Kineto's correlation id
    kineto: KinetoArgs | None = None  # the Kineto args of its event that later stages read
    parent: int | None = None  # effective parent item id (host tree, orphans re-attached)
    orphan_parent: int | None = None
    enclosing: int | None = None  # innermost item on the same thread whose time contains this one
    launcher: int | None = None  # GPU items: the runtime call item that launched it
    comm: Comm | None = None
    pos: int = 0  # place in its thread's or stream's chain: breaks ties between equal start times
    part_of: int | None = None  # SELF_PART / RESUME / WAKEUP / DELAY: the op (or thread) this period belongs to
    # what the waits stage found this item waited for (`wait_for`); () while nothing: most items wait for none, and
    # an empty list per item held about 16 MB on a trace of 224k items
    awaits: list[Await] | tuple[()] = ()

    def wait_for(self, *waits: Await) -> None:
        """Record waits the waits stage found, after those already recorded."""
        if isinstance(self.awaits, list):
            self.awaits.extend(waits)
        elif waits:
            self.awaits = list(waits)


class Await(msgspec.Struct, frozen=True, gc=False):
    """One wait the waits stage found: the item waited for, on which evidence. The wait sources in etweave.deps
    turn each into an edge to the waiting item."""

    item: int  # the item waited for
    evidence: Evidence
    inferred: bool  # True when the evidence is indirect (timing, partial records)


class Edge(msgspec.Struct, gc=False):
    src: int
    dst: int
    source: Evidence  # the evidence source that produced it
    inferred: bool = False  # True when the evidence is indirect (timing, partial records)

    def __hash__(self) -> int:  # hashable though mutable (edges are deduplicated in sets)
        return hash((self.src, self.dst, self.source, self.inferred))


class Ids:
    """The one source of fresh ids in a conversion: made once, above every host ET id, and handed to every stage
    that synthesizes ops or items (Kineto cpu ops as ops, thread roots, device items, periods)."""

    __slots__ = ("_next",)

    def __init__(self, first: int) -> None:
        self._next = first

    def next(self) -> int:
        """A fresh id: the smallest not handed out yet."""
        n = self._next
        self._next = n + 1
        return n

    def take(self, n: int) -> range:
        """n fresh ids in a row (what n calls of `next()` would hand out)."""
        first = self._next
        self._next = first + n
        return range(first, first + n)

    def peek(self) -> int:
        """The id `next()` would hand out (nothing is taken)."""
        return self._next


def first_measured_start(g: Graph) -> float:
    """The run's first measured instant (0 with nothing measured). (A comprehension: attrgetters in C cost more than
    twice its step per item.)"""
    return min([it.start for it in g.items if it.measured], default=0.0)


_KIND = operator.attrgetter("kind")
_ID = operator.attrgetter("id")
# kind sets asked of `Graph.of_kinds`, one object each
RUNTIME_KIND, HOST_OP_KIND = frozenset({RUNTIME}), frozenset({HOST_OP})
PROCESS_ROOT_KIND, THREAD_ROOT_KIND = frozenset({PROCESS_ROOT}), frozenset({THREAD_ROOT})
OP_KINDS = frozenset({PROCESS_ROOT, THREAD_ROOT, HOST_OP})  # the items of host ops (those that may have `host`)
_SINGLE_KINDS = {kind: frozenset({kind}) for kind in ASSEMBLED_KINDS}  # (the keys of `Graph.index_kinds`)


class RecordTail(msgspec.Struct, frozen=True):
    """A collective whose record was still open when the thread that handed it over, idle from the hand-over,
    resumed (docs/FACTS.md §W3), as the waits stage found it."""

    op: int  # the collective's item
    period: int  # the handing thread's idle period, at whose end it resumed
    tail: float  # µs from that resume to the record's end
    modelled: bool  # taken as a wait: the op cut at the resume, the period's time a wake-up edge (else only named)


class InputFiles(msgspec.Struct, frozen=True):
    """The files a graph was built from ("" for none), for messages that name the file a bad field came from."""

    host: str = ""
    device: str = ""


class Graph(msgspec.Struct):
    items: list[Item]  # in id order once built
    by_id: dict[int, Item]
    ids: Ids  # the conversion's allocator: synthesized items take their ids from it
    rank: int = 0
    threads: dict[int | str, list[int]] = msgspec.field(default_factory=dict)  # tid -> item ids in program order
    streams: dict[tuple[int, int], list[int]] = msgspec.field(default_factory=dict)  # (device, stream) -> ids in order
    files: InputFiles = msgspec.field(default_factory=InputFiles)
    # The Kineto synchronization calls (cudaStreamSynchronize, cudaEventSynchronize, cudaStreamWaitEvent, ...):
    # the waits stage reads which stream or event each one waited on.
    sync_events: list[SyncRecord] = msgspec.field(default_factory=list)
    # The items that recorded a wait (`Item.awaits`), in item order, kept by the waits stage once it is done: the wait
    # sources read them here instead of each passing over every item. None until then.
    waiting: list[Item] | None = None
    record_tails: list[RecordTail] = msgspec.field(default_factory=list)  # found by the waits stage, for the audit
    # what `of_kinds` found, per set of kinds asked
    kind_index: dict[frozenset[str], list[Item]] = msgspec.field(default_factory=dict)

    def add(self, it: Item) -> Item:
        """Add a synthesized item (its id is taken from the conversion's allocator)."""
        it.id = self.ids.next()
        self.items.append(it)
        self.by_id[it.id] = it
        if it.kind in ASSEMBLED_KINDS:  # (later stages add only periods)
            self.kind_index.clear()
        return it

    def index_kinds(self, by_kind: dict[str, list[Item]]) -> None:
        """Take the items of each of `ASSEMBLED_KINDS` as assemble made them (each list in item order; a kind
        missing has none): `of_kinds` then merges these few lists instead of passing over every item."""
        index = self.kind_index
        for kind in ASSEMBLED_KINDS:
            index[_SINGLE_KINDS[kind]] = by_kind.get(kind, [])

    def of_kinds(self, kinds: frozenset[str]) -> list[Item]:
        """The items of these kinds (of `ASSEMBLED_KINDS`), in item order: found the first time (merged from each
        kind's items where assemble indexed them, else in one pass in C), then shared by every stage that reads
        them (not to be changed by the caller)."""
        index = self.kind_index
        found = index.get(kinds)
        if found is None:
            assert kinds <= ASSEMBLED_KINDS, f"{sorted(kinds - ASSEMBLED_KINDS)} are not kinds only assemble makes"
            parts = [index.get(_SINGLE_KINDS[kind]) for kind in sorted(kinds)]
            if all(part is not None for part in parts):  # (each in item order: a sort of runs, by id)
                found = sorted(itertools.chain.from_iterable(filter(None, parts)), key=_ID)
            else:
                items = self.items
                found = list(itertools.compress(items, map(kinds.__contains__, map(_KIND, items))))
            index[kinds] = found
        return found
