"""The evidence an edge can rest on: one `Evidence` member per source, with its name (written in the report's
`edges.per_source`, in attr `dep_evidence` and by `--explain`), whether its edges are recorded or inferred, whether
it says "the target waited for the source to end", and what it is. The README's "Dependencies" table is checked
against this registry (tests/unit/test_docs_evidence.py). A leaf module: the model, the waits stage and the
sources all import it."""

from __future__ import annotations

from enum import Enum, StrEnum

# A waiter resumes within this long after what it waited for ended (µs), as FORMATS.md's traces show.
WAIT_TOLERANCE = 5.0
# A thread waiting for work it handed to another thread (a gloo worker, the autograd engine, a helper thread)
# resumes up to this long after that work ended (µs): 78-283 µs on CPU gloo runs (FORMATS.md, "Waiting on CPU
# threads"); the bound keeps a period that merely overlapped the other thread's work from being taken as a wait.
MAX_WAKEUP = 1000.0


class Basis(Enum):
    """How a source knows its edges."""

    RECORDED = "recorded"  # the trace records the relation (ids, correlation, order of one thread or stream)
    INFERRED = "inferred"  # indirect: timing, structure, partial records
    EITHER = "recorded or inferred"  # per edge (Edge.inferred says which)


class Evidence(StrEnum):
    """An evidence source. The value is its name as written in every output."""

    basis: Basis
    waits: bool  # its edges say "the target waited for the source to end": the source ended before it began
    description: str

    def __new__(cls, name: str, basis: Basis, waits: bool, description: str) -> Evidence:
        member = str.__new__(cls, name)
        member._value_ = name
        member.basis, member.waits, member.description = basis, waits, description
        return member

    THREAD_ORDER = ("thread_order", Basis.RECORDED, False,
                    "program order of one CPU thread; each thread root after the process root")
    LAUNCH = ("launch", Basis.RECORDED, False,
              "runtime launch call -> the GPU event it launched (Kineto correlation), and -> the idle time on the "
              "stream before it")
    STREAM_ORDER = ("stream_order", Basis.RECORDED, True, "events of one (device, stream) in measured order")
    SYNC = ("sync", Basis.RECORDED, True,
            "a blocking CUDA call (stream/device/event sync, synchronous copy) -> the GPU op it waited for")
    EVENT_WAIT = ("event_wait", Basis.EITHER, True,
                  "cudaStreamWaitEvent: the first op on the waiting stream -> the op the event was recorded after")
    STREAM_WAIT = ("stream_wait", Basis.INFERRED, True,
                   "a GPU op that started later than its stream and launch allowed -> another stream's op that "
                   "ended just before")
    THREAD_WAIT = ("thread_wait", Basis.INFERRED, True,
                   "a thread's wake-up -> the op of another thread it waited for")
    HANDOFF = ("handoff", Basis.INFERRED, False,
               "a worker thread's first op (or wake-up) after idle -> the op of the thread that handed it work")
    AUTOGRAD = ("autograd", Basis.RECORDED, False,
                "backward op -> its forward op (same sequence number on another thread)")
    TENSOR_FLOW = ("tensor_flow", Basis.RECORDED, False,
                   "producer -> consumer of a tensor (same tensor and storage id) across threads")
    COLLECTIVE_ORDER = ("collective_order", Basis.RECORDED, False,
                        "collectives of one process group in issue order")
    # Not a per-rank source: `convert-run` adds it to a rank's first nodes, after the rank's nodes were built.
    RANK_START_OFFSET = ("rank_start_offset", Basis.RECORDED, False,
                         "`convert-run`: a rank's first nodes -> its `[rank start offset]` delay node")
