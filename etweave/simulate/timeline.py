"""Chrome/Perfetto trace JSON with the measured and the simulated timeline side by side (`simulate --timeline`).

Per rank two processes, "measured rank R" and "simulated rank R", one track (thread) per resource: CPU thread or
GPU stream (`no resource` for nodes that take none). One slice per op: an op's first node and its `[self]` /
`[resumed]` parts (attr `part_of`) are one slice from the op's start to the end of its last part, and a host op's
slice also spans its host call-stack children on the same track (attr `et_parent`), so slices nest as the call
stack did. A slice that would still overlap another one partly (which Perfetto cannot draw) goes to an extra
track named `<resource> (overlap N)`; on the shared real traces there are none.

Simulated times are shifted by the earliest measured start so both share one time axis; a simulated node spans
issue to end (for a collective that includes the wait for its peers, as a measured NCCL kernel does: `wait_us`).
The simulated critical path is marked: slices on it carry `critical_path_us`, each simulated rank has a
`critical path` track holding the path's nodes, and each edge of the path is a flow arrow (events "s"/"f").
Slice args: `id` (the op's node id), `kind`, `evidence` (`"<dep id> <evidence source>"` per data_dep of the op's
first node, from attr `dep_evidence`), `parts` (the other node ids merged into the slice).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import attr_value, iter_et
from etweave.nodes import DEP_EVIDENCE, is_marker_node
from etweave.simulate.engine import Replay, SimNode
from etweave.simulate.metrics import measured_window

NO_RESOURCE = "no resource"
CRITICAL_TRACK = "critical path"


class NodeDetail(msgspec.Struct, frozen=True):
    """What the timeline reads from a node beyond what the replay keeps."""

    kind: str = ""
    part_of: int | None = None
    parent: int | None = None  # attr et_parent: the host call-stack parent
    deps: tuple[int, ...] = ()
    evidence: tuple[str, ...] = ()


def node_details(nodes: Iterable[pb.Node]) -> dict[int, NodeDetail]:
    out: dict[int, NodeDetail] = {}
    for node in nodes:
        kind, part_of, parent = "", None, None
        evidence: tuple[str, ...] = ()
        for a in node.attr:
            if a.name == "kind":
                kind = a.string_val
            elif a.name == "part_of":
                part_of = int(a.int64_val)
            elif a.name == "et_parent":
                parent = int(a.int64_val)
            elif a.name == DEP_EVIDENCE:
                value = attr_value(a)
                evidence = tuple(str(v) for v in value) if isinstance(value, list) else ()
        out[node.id] = NodeDetail(kind, part_of, parent, tuple(node.data_deps), evidence)
    return out


def load_details(replay: Replay) -> list[dict[int, NodeDetail]]:
    """Per rank, the details read again from the file the rank came from (none for graphs built in memory)."""
    details = []
    for rg in replay.ranks:
        path = Path(rg.source) if rg.source else None
        details.append(node_details(iter_et(path)[1]) if path is not None and path.is_file() else {})
    return details


class _Slice(msgspec.Struct):
    op: int  # node index of the op's first node
    parts: list[int]  # node indices merged into it (the op's own node among them when it has a time here)
    track: str
    start: float
    end: float


def _slices(nodes: Sequence[SimNode], details: dict[int, NodeDetail], times: Sequence[tuple[float, float] | None]
            ) -> list[_Slice]:
    """One slice per op that has a time in this view, spanning its parts and its same-track call-stack children."""
    index = {nd.id: i for i, nd in enumerate(nodes)}
    by_op: dict[int, _Slice] = {}
    for i, nd in enumerate(nodes):
        t = times[i]
        if t is None:
            continue
        d = details.get(nd.id)
        op = index.get(d.part_of, i) if d is not None and d.part_of is not None else i
        s = by_op.get(op)
        if s is None:
            by_op[op] = _Slice(op, [i], nodes[op].resource or NO_RESOURCE, t[0], t[1])
        else:
            s.parts.append(i)
            s.start, s.end = min(s.start, t[0]), max(s.end, t[1])
    # a host op spans its call-stack children on its track: deepest first, so grandchildren reach the root
    depth: dict[int, int] = {}

    def depth_of(op: int) -> int:
        chain = []
        cur: int | None = op
        while cur is not None and cur not in depth:
            chain.append(cur)
            d = details.get(nodes[cur].id)
            parent = index.get(d.parent) if d is not None and d.parent is not None else None
            cur = parent if parent is not None and parent not in chain else None
        base = depth[cur] + 1 if cur is not None else 0
        for k, c in enumerate(reversed(chain)):
            depth[c] = base + k
        return depth[op]

    for op in sorted(by_op, key=lambda o: (-depth_of(o), o)):
        d = details.get(nodes[op].id)
        parent = index.get(d.parent) if d is not None and d.parent is not None else None
        ps = by_op.get(parent) if parent is not None else None
        s = by_op[op]
        if ps is not None and ps.track == s.track:
            ps.start, ps.end = min(ps.start, s.start), max(ps.end, s.end)
    return sorted(by_op.values(), key=lambda s: (s.track, s.start, -s.end, s.op))


def _lanes(slices: list[_Slice]) -> list[int]:
    """Per slice (sorted by track, start, longest first), the lane of its track where it nests in whatever is open:
    lane 0 unless it would partly overlap an open slice there."""
    lanes: list[int] = []
    stacks: list[list[float]] = []
    track = None
    for s in slices:
        if s.track != track:
            track, stacks = s.track, []
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s.start:
                stack.pop()
            if not stack or s.end <= stack[-1]:
                stack.append(s.end)
                lanes.append(lane)
                break
        else:
            stacks.append([s.end])
            lanes.append(len(stacks) - 1)
    return lanes


def _track_sort_key(name: str) -> tuple[int, str]:
    return (0 if name.startswith("cpu") else 1 if name.startswith("gpu") else 2, name)


def timeline_events(replay: Replay, details: Sequence[dict[int, NodeDetail]] | None = None) -> list[dict[str, Any]]:
    """The trace events. `details` per rank (`load_details`): without them every node is its own slice."""
    if details is None:
        details = [{} for _ in replay.ranks]
    window = measured_window(replay)
    origin = window[0] if window else 0
    events: list[dict[str, Any]] = []
    critical: dict[tuple[int, int], int] = dict(zip(replay.critical_path, replay.contribution, strict=True))
    # where each critical node's slice sits in the simulated view, for the flow arrows: (pid, tid)
    placed: dict[tuple[int, int], tuple[int, int]] = {}
    for ri in range(len(replay.ranks)):
        measured_pid, simulated_pid = 1 + 2 * ri, 2 + 2 * ri  # alternate so each rank's pair sits together
        measured_times, simulated_times = _view_times(replay, ri, origin)
        view = _View(replay, ri, details[ri], critical, placed)
        events += view.events(measured_pid, "measured", measured_times)
        events += view.events(simulated_pid, "simulated", simulated_times)
        events.extend(_critical_track(replay, ri, simulated_pid, origin))
    events.extend(_critical_flows(replay, placed, origin))
    return events


class _View(msgspec.Struct):
    """One rank's slices in one view (measured or simulated) as trace events; a simulated slice on the critical
    path is noted in `placed` for the flow arrows."""

    replay: Replay
    ri: int
    details: dict[int, NodeDetail]
    critical: dict[tuple[int, int], int]
    placed: dict[tuple[int, int], tuple[int, int]]

    def events(self, pid: int, label: str, times: Sequence[tuple[float, float] | None]) -> list[dict[str, Any]]:
        rg = self.replay.ranks[self.ri]
        slices = _slices(rg.nodes, self.details, times)
        lanes = _lanes(slices)
        names = sorted({(s.track, lane) for s, lane in zip(slices, lanes, strict=True)},
                       key=lambda tl: (_track_sort_key(tl[0]), tl[1]))
        tids = {tl: k + 1 for k, tl in enumerate(names)}
        events: list[dict[str, Any]] = []
        for s, lane in zip(slices, lanes, strict=True):
            tid = tids[(s.track, lane)]
            args = self._args(s)
            if label == "simulated":
                self._simulated_args(args, s)
                if "critical_path_us" in args:
                    self.placed.update(((self.ri, p), (pid, tid)) for p in s.parts)
            events.append({"name": rg.nodes[s.op].name, "ph": "X", "pid": pid, "tid": tid,
                           "ts": s.start, "dur": s.end - s.start, "args": args})
        return events + _track_names(pid, f"{label} rank {rg.rank}", tids)

    def _args(self, s: _Slice) -> dict[str, Any]:
        """The op's node id, kind, the evidence of each data dep, the other nodes merged into the slice."""
        nodes = self.replay.ranks[self.ri].nodes
        d = self.details.get(nodes[s.op].id)
        args: dict[str, Any] = {"id": nodes[s.op].id}
        if d is not None:
            args["kind"] = d.kind
            if d.deps:
                args["evidence"] = [f"{dep} {d.evidence[k] if k < len(d.evidence) else 'unknown'}"
                                    for k, dep in enumerate(d.deps)]
        merged = [nodes[p].id for p in s.parts if p != s.op]
        if merged:
            args["parts"] = merged
        return args

    def _simulated_args(self, args: dict[str, Any], s: _Slice) -> None:
        """The wait from issue to start, and what the slice adds to the critical path."""
        issue, start = self.replay.issue[self.ri][s.op], self.replay.start[self.ri][s.op]
        if start > issue:
            args["wait_us"] = start - issue
        on_path = [self.critical[(self.ri, p)] for p in s.parts if (self.ri, p) in self.critical]
        if on_path:
            args["critical_path_us"] = sum(on_path)


def _track_names(pid: int, process: str, tids: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    """Metadata events: the process's name and order, each track's name (`(overlap N)` for lane N) and order."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": process}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
    for (track, lane), tid in tids.items():
        name = track if lane == 0 else f"{track} (overlap {lane})"
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events


def _view_times(replay: Replay, ri: int, origin: int) -> tuple[list[tuple[float, float] | None], ...]:
    """Per node of rank index `ri`, its (start, end) measured and simulated (issue to end, in the measured frame);
    None where it has none. Metadata nodes take no time."""
    rg, issue, end = replay.ranks[ri], replay.issue[ri], replay.end[ri]
    # roots and process-group init are zero-length markers (METADATA_NODE in older outputs), not ops to draw
    untimed = [is_marker_node(nd.type, nd.kind) for nd in rg.nodes]
    measured: list[tuple[float, float] | None] = [
        None if untimed[i] or not nd.measured_start else
        (float(nd.measured_start), float(nd.measured_start + nd.measured_duration)) for i, nd in enumerate(rg.nodes)]
    simulated: list[tuple[float, float] | None] = [
        None if untimed[i] or end[i] < 0 else (float(origin + issue[i]), float(origin + end[i]))
        for i in range(len(rg.nodes))]  # end < 0 only after a deadlock
    return measured, simulated


def op_spans(replay: Replay, ri: int, details: dict[int, NodeDetail], origin: int
             ) -> tuple[dict[int, tuple[float, float]], dict[int, tuple[float, float]]]:
    """Per op (node index of its first node), its slice's (start, end): measured, and simulated in the measured
    frame, as the timeline draws them."""
    measured, simulated = (
        {s.op: (s.start, s.end) for s in _slices(replay.ranks[ri].nodes, details, times)}
        for times in _view_times(replay, ri, origin))
    return measured, simulated


def _critical_track(replay: Replay, ri: int, pid: int, origin: int) -> list[dict[str, Any]]:
    """The rank's critical-path nodes on a track of their own: each from where the path reached it to its end."""
    events: list[dict[str, Any]] = []
    for (rj, i), contribution in zip(replay.critical_path, replay.contribution, strict=True):
        if rj == ri:
            nd, end = replay.ranks[ri].nodes[i], replay.end[ri][i]
            events.append({"name": nd.name, "ph": "X", "pid": pid, "tid": 0, "ts": origin + end - contribution,
                           "dur": contribution, "args": {"id": nd.id, "critical_path_us": contribution}})
    if events:
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": CRITICAL_TRACK}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": 0}})
    return events


def _critical_flows(replay: Replay, placed: dict[tuple[int, int], tuple[int, int]], origin: int
                    ) -> list[dict[str, Any]]:
    """One flow arrow per edge of the critical path, from the middle of its source's period to its target's."""
    events: list[dict[str, Any]] = []
    path = replay.critical_path
    for k in range(1, len(path)):
        a, b = path[k - 1], path[k]
        if a not in placed or b not in placed:
            continue  # metadata nodes have no slice
        for (ri, i), ph in ((a, "s"), (b, "f")):
            pid, tid = placed[(ri, i)]
            mid = origin + (replay.start[ri][i] + replay.end[ri][i]) / 2
            event = {"name": CRITICAL_TRACK, "cat": "critical_path", "ph": ph, "id": k, "pid": pid, "tid": tid,
                     "ts": mid}
            if ph == "f":
                event["bp"] = "e"  # bind to the slice enclosing ts
            events.append(event)
    return events


def timeline_bytes(replay: Replay, details: Sequence[dict[int, NodeDetail]] | None = None) -> bytes:
    """The trace file's bytes (etweave.renderers.TimelineRenderer writes them). Without `details` they are read
    again from each rank's file."""
    if details is None:
        details = load_details(replay)
    return orjson.dumps({"traceEvents": timeline_events(replay, details), "displayTimeUnit": "ms"})
