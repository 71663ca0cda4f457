"""The evidence an edge can rest on: one `Evidence` member per source, with its name (written in the report's
`edges.per_source`, in attr `dep_evidence` and by `--explain`), whether its edges are recorded or inferred, whether
it says "the target waited for the source to end", and what it is. The README's "Dependencies" table is checked
against this registry (tests/unit/test_evidence_docs.py). A leaf module: the model, the waits stage and the
sources all import it."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

# A waiter resumes within this long after what it waited for ended (µs), as the shared traces show (docs/FACTS.md §W1).
WAIT_TOLERANCE = 5.0
# A thread waiting for work it handed to another thread (a gloo worker, the autograd engine, a helper thread)
# resumes up to this long after that work ended (µs): 78-283 µs on CPU gloo runs (docs/FACTS.md
# §W1); the bound keeps a period that merely overlapped the other thread's work from being taken as a wait.
MAX_WAKEUP = 1000.0


class Basis(Enum):
    """How a source knows its edges."""

    RECORDED = "recorded"  # the trace records the relation (ids, correlation, order of one thread or stream)
    INFERRED = "inferred"  # indirect: timing, structure, partial records
    EITHER = "recorded or inferred"  # per edge (Edge.inferred says which)


class Evidence(str, Enum):
    """An evidence source. The value is its name as written in every output (`str()` and f-strings give it too);
    what the source is and says is in `ABOUT`."""

    THREAD_ORDER = "thread_order"
    LAUNCH = "launch"
    STREAM_ORDER = "stream_order"
    SYNC = "sync"
    EVENT_WAIT = "event_wait"
    STREAM_WAIT = "stream_wait"
    THREAD_WAIT = "thread_wait"
    HANDOFF = "handoff"
    AUTOGRAD = "autograd"
    TENSOR_FLOW = "tensor_flow"
    COLLECTIVE_ORDER = "collective_order"
    # Not a per-rank source: `convert-run` adds it to a rank's first nodes, after the rank's nodes were built.
    RANK_START_OFFSET = "rank_start_offset"

    def __str__(self) -> str:
        return str(self.value)

    @property
    def basis(self) -> Basis:
        return ABOUT[self].basis

    @property
    def waits(self) -> bool:
        return ABOUT[self].waits

    @property
    def description(self) -> str:
        return ABOUT[self].description


class About(NamedTuple):
    basis: Basis
    waits: bool  # its edges say "the target waited for the source to end": the source ended before it began
    description: str


ABOUT: dict[Evidence, About] = {
    Evidence.THREAD_ORDER: About(Basis.RECORDED, False,
        'program order of one CPU thread; each thread root after the process root'),
    Evidence.LAUNCH: About(Basis.RECORDED, False,
        'runtime launch call -> the GPU event it launched (Kineto correlation), and -> the idle time on the stream '
        'before it'),
    Evidence.STREAM_ORDER: About(Basis.RECORDED, True, 'events of one (device, stream) in measured order'),
    Evidence.SYNC: About(Basis.RECORDED, True,
        'a blocking CUDA call (stream/device/event sync, synchronous copy) -> the GPU op it waited for'),
    Evidence.EVENT_WAIT: About(Basis.EITHER, True,
        'cudaStreamWaitEvent: the first op on the waiting stream -> the op the event was recorded after'),
    Evidence.STREAM_WAIT: About(Basis.INFERRED, True,
        "a GPU op that started later than its stream and launch allowed -> another stream's op that ended just "
        'before'),
    Evidence.THREAD_WAIT: About(Basis.INFERRED, True, "a thread's wake-up -> the op of another thread it waited for"),
    Evidence.HANDOFF: About(Basis.INFERRED, False,
        "a worker thread's first op (or wake-up) after idle -> the op of the thread that handed it work"),
    Evidence.AUTOGRAD: About(Basis.RECORDED, False,
        'backward op -> its forward op (same sequence number on another thread)'),
    Evidence.TENSOR_FLOW: About(Basis.RECORDED, False,
        'producer -> consumer of a tensor (same tensor and storage id) across threads'),
    Evidence.COLLECTIVE_ORDER: About(Basis.RECORDED, False, 'collectives of one process group in issue order'),
    Evidence.RANK_START_OFFSET: About(Basis.RECORDED, False,
        "`convert-run`: a rank's first nodes -> its `[rank start offset]` delay node"),
}
