"""One rank's conversion as the stages see it: the inputs, then what each stage adds, in the order they run
(`etweave.convert.STAGES`). A stage reads the fields of the stages before it and sets its own; nothing else is
passed between stages."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import msgspec
from msgspec import field

from etweave.errors import BadInput
from etweave.model import Ids
from etweave.read import widths

if TYPE_CHECKING:  # annotations only: these modules are the stages, which read this one
    from etweave.collectives import CollectiveStats
    from etweave.deps import Dependencies
    from etweave.link import DeviceSelection, HostLink, Selection, Window
    from etweave.model import Graph
    from etweave.nodes import Rounded
    from etweave.read.host_et import HostOp, HostTrace
    from etweave.read.kineto import KinetoTrace
    from etweave.repair import Repair
    from etweave.report import Report
    from etweave.roofline import Roofline

T = TypeVar("T")


class Conversion(msgspec.Struct):
    # The inputs
    host: HostTrace | None
    kineto: KinetoTrace | None
    rank: int
    allow_mismatch: bool = False
    window: Window | None = None  # the selection resolved on the Kineto trace's clock (µs)
    ids: Ids = field(default_factory=lambda: Ids(1))  # every fresh id of this conversion comes from here
    # the caller handed the traces over: assemble lets go of what only it and the stages before read of them once it
    # has made the items (`let_go_of_inputs`)
    inputs_handed_over: bool = False
    # link
    link: HostLink | None = None
    ops: list[HostOp] = field(default_factory=list)  # every op the graph is built from: the host ET's, then added
    added_ops: list[HostOp] = field(default_factory=list)  # made from Kineto cpu ops that no host op stands for
    mismatch: list[str] = field(default_factory=list)  # evidence that host and Kineto are not of one run and rank
    device: DeviceSelection | None = None  # None without a Kineto trace
    # repair
    repair: Repair | None = None
    # assemble (the graph is then changed in place: collectives, waits and deps mark, split and order its items)
    graph: Graph | None = None
    # collectives
    group_ids: dict[str, str] = field(default_factory=dict)  # trace process-group name -> comm-group id ("" = all)
    collectives: CollectiveStats | None = None
    # infer dependencies (waits first)
    deps: Dependencies | None = None
    # roofline
    roofline: Roofline | None = None
    # audit
    times: Rounded | None = None  # every item's times rounded, as its node writes them (the encoder reads them too)
    report: Report | None = None

    @classmethod
    def start(cls, host: HostTrace | None, kineto: KinetoTrace | None, rank: int | None = None,
              selection: Selection | None = None, allow_mismatch: bool = False) -> Conversion:
        """The inputs checked, the rank chosen (given, else the Kineto trace's, else 0), the selection resolved,
        and the id allocator made: fresh ids start above every host ET id."""
        if host is None and kineto is None:
            raise BadInput("convert", "give a host ET (--host), a Kineto trace (--device), or both")
        if rank is None:
            rank = (kineto.rank if kineto is not None else None) or 0
        widths.rank("--rank", "rank", rank)
        window = None
        if selection is not None:
            if kineto is None:
                raise BadInput("convert", "--steps and --window select part of a Kineto trace: give --device")
            window = selection.resolve(kineto)
        first_id = max((op.id for op in host.ops), default=0) + 1 if host is not None else 1
        return cls(host, kineto, rank, allow_mismatch=allow_mismatch, window=window, ids=Ids(first_id))

    @property
    def kineto_only(self) -> bool:
        """No host ET: the Kineto cpu ops stand in for the host ops."""
        return self.host is None

    def let_go_of_inputs(self) -> None:
        """Let go of the Kineto trace's events and of the columns no later stage reads, of the ops the items were made
        from, and of what only assemble read of the link's device selection and of the repair (parents, launchers):
        every item carries what later stages read of them (README "Layout", assemble), and on a Kineto-only trace
        they are most of the memory held until the nodes are written. The host ET's ops stay (the audit counts
        them)."""
        if self.kineto is not None:
            self.kineto.events.release(keep=_COLUMNS_READ_AFTER_THE_ITEMS)
        self.ops = []
        if self.repair is not None:
            self.repair.parent_of = {}
        if self.device is not None:  # the audit reads its counts and what was left out
            self.device.runtime, self.device.gpu, self.device.launcher_of = [], [], {}


# The Kineto columns the stages after assemble read: the audit's count of the trace's cpu ops, those left out of the
# window, and their examples (`audit._kineto_cpu_ops`).
_COLUMNS_READ_AFTER_THE_ITEMS = ("cpu", "ts", "name")


def need(value: T | None, what: str) -> T:
    """A field a stage needs from an earlier stage; a stage run out of order is an etweave bug."""
    if value is None:
        raise RuntimeError(f"the conversion has no {what} yet: a stage ran before the stage that makes it")
    return value
