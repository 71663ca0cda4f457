"""Chrome/Perfetto trace JSON with the measured and the simulated timeline side by side.

Per rank two processes, "measured rank R" and "simulated rank R", one thread per resource. Simulated times are
shifted by the earliest measured start so both tracks share one time axis. A simulated node spans issue to end:
for a collective that includes the wait for its peers, as a measured NCCL kernel does (`wait_us` in its args).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.output import write_atomic
from etweave.simulate.engine import Replay
from etweave.simulate.metrics import measured_window

NO_RESOURCE = "no resource"


def timeline_events(replay: Replay) -> list[dict[str, Any]]:
    window = measured_window(replay)
    origin = window[0] if window else 0
    events: list[dict[str, Any]] = []
    for ri, rg in enumerate(replay.ranks):
        measured_pid, simulated_pid = 1 + 2 * ri, 2 + 2 * ri  # alternate so each rank's pair sits together
        tids: dict[str, int] = {}

        def tid_of(resource: str | None, tids: dict[str, int] = tids) -> int:
            return tids.setdefault(resource or NO_RESOURCE, len(tids) + 1)

        issue, start, end = replay.issue[ri], replay.start[ri], replay.end[ri]
        for i, nd in enumerate(rg.nodes):
            if nd.measured_start:
                events.append({"name": nd.name, "ph": "X", "pid": measured_pid, "tid": tid_of(nd.resource),
                               "ts": nd.measured_start, "dur": nd.measured_duration, "args": {"id": nd.id}})
            if nd.type == pb.METADATA_NODE or end[i] < 0:
                continue  # metadata takes no time; end < 0 only after a deadlock
            args: dict[str, Any] = {"id": nd.id}
            if start[i] > issue[i]:
                args["wait_us"] = start[i] - issue[i]
            events.append({"name": nd.name, "ph": "X", "pid": simulated_pid, "tid": tid_of(nd.resource),
                           "ts": origin + issue[i], "dur": end[i] - issue[i], "args": args})
        for pid, label in ((measured_pid, "measured"), (simulated_pid, "simulated")):
            events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{label} rank {rg.rank}"}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
            for name, tid in tids.items():
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
    return events


def write_timeline(path: Path, replay: Replay) -> None:
    """Write atomically: a temporary file beside `path`, renamed once complete."""
    data = orjson.dumps({"traceEvents": timeline_events(replay), "displayTimeUnit": "ms"})
    write_atomic(Path(path), data)
