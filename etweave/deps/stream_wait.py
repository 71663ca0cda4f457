"""Evidence `stream_wait`: a GPU op that started later than its stream and launch allowed waited for the op of
another stream that ended just before (inferred; cross-stream event waits often carry no ids). The finder says
when an op was late and for what (run by the waits stage, which adds the idle time left as a `[gpu idle]` node);
the source gives the edges."""

from __future__ import annotations

import math

import msgspec

from etweave.deps.awaited import awaited
from etweave.deps.evidence import WAIT_TOLERANCE as TOLERANCE
from etweave.deps.evidence import Evidence
from etweave.deps.timeline import latest_before
from etweave.model import Edge, Graph, Item


def stream_wait(g: Graph) -> list[Edge]:
    """A GPU op that started later than its stream and launch allowed, after another stream's op (inferred)."""
    return awaited(g, Evidence.STREAM_WAIT)


class LateStart(msgspec.Struct):
    """A GPU op that started more than TOLERANCE after it was ready (`ready`: its stream free, its launch returned,
    the events it waited for done): `other` is the op on another stream of its device that ended last before it
    started (None: none did), `waited` whether the op waited for it (it started within TOLERANCE of its end), and
    the op was idle from `idle_from` (after its launch began)."""

    launch: Item | None
    ready: float
    other: Item | None
    waited: bool
    idle_from: float


def find_late_start(g: Graph, it: Item, stream: int, stream_free: float,
                    device_ends: tuple[list[float], list[Item]] | None) -> LateStart | None:
    """Whether GPU op `it` on `stream` (free from `stream_free`) started late, and what it waited for
    (`device_ends`: its device's GPU ops by end, looked up only for a late op)."""
    launch = g.by_id.get(it.launcher) if it.launcher is not None else None
    ready = max(stream_free, launch.seg_end if launch else -math.inf, *(
        g.by_id[a.item].start + g.by_id[a.item].dur for a in it.awaits if a.evidence is Evidence.EVENT_WAIT
    )) if it.awaits else max(stream_free, launch.seg_end if launch else -math.inf)  # (most ops: no generator)
    if it.start - ready <= TOLERANCE:
        return None
    assert device_ends is not None, "a late GPU op's device has GPU ops"
    ends, ops = device_ends
    x = latest_before(ends, ops, ready, it.start + TOLERANCE, lambda o: (o.stream or 0) != stream)
    idle_from, waited = ready, False
    if x is not None:
        x_end = x.start + x.dur
        waited = it.start - x_end <= TOLERANCE
        # it waited for x; else it waited for x, then for something no record shows: idle after x
        idle_from = it.start if waited else x_end
    if launch is not None and idle_from <= launch.start:
        # a launch that returned at once (a zero-length node) starts where the idle time does: keep the idle node a
        # hair later so its edge from the launch goes forward in the total order
        idle_from = math.nextafter(launch.start, math.inf)
    return LateStart(launch, ready, x, waited, idle_from)
