"""Per-node and per-step tables of a replay: lists of flat records (one dict per row, pandas-friendly:
`pandas.DataFrame(records)`) and CSV files (`simulate --csv`, `--steps-csv`).

Times are µs in the summary's common frame: 0 is the earliest measured start over all ranks (`origin_us`).
Empty cells (None) where a value does not exist (a node without a measured start, a deadlocked node).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from typing import Any

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.schema import node_type_name
from etweave.simulate.engine import Replay
from etweave.simulate.metrics import measured_window
from etweave.simulate.timeline import NodeDetail, op_spans
from etweave.stats import percent

NODE_COLUMNS = ["rank", "id", "name", "type", "kind", "resource", "part_of", "measured_start_us",
                "measured_duration_us", "simulated_issue_us", "simulated_start_us", "simulated_end_us",
                "simulated_duration_us", "start_error_us", "critical_path_order", "critical_path_us"]
STEP_COLUMNS = ["rank", "step", "id", "measured_start_us", "measured_duration_us", "simulated_start_us",
                "simulated_duration_us", "duration_error_pct"]
CRITICAL_COLUMNS = ["order", "rank", "id", "name", "resource", "simulated_start_us", "simulated_end_us",
                    "critical_path_us"]
STEP_PREFIX = "ProfilerStep#"
WHOLE_RANK = "(no ProfilerStep: whole rank)"


def _origin(replay: Replay) -> int:
    window = measured_window(replay)
    return window[0] if window else 0


def _type_name(value: int) -> str:
    return node_type_name(value) if value in pb.NodeType.values() else str(value)


def critical_path_records(replay: Replay) -> list[dict[str, Any]]:
    """The whole critical path, earliest first; `critical_path_us` sums to the makespan."""
    rows = []
    for order, ((ri, i), contribution) in enumerate(zip(replay.critical_path, replay.contribution, strict=True)):
        nd = replay.ranks[ri].nodes[i]
        rows.append({"order": order, "rank": replay.ranks[ri].rank, "id": nd.id, "name": nd.name,
                     "resource": nd.resource, "simulated_start_us": replay.start[ri][i],
                     "simulated_end_us": replay.end[ri][i], "critical_path_us": contribution})
    return rows


def node_records(replay: Replay, details: Sequence[dict[int, NodeDetail]] | None = None) -> list[dict[str, Any]]:
    """One row per node of every rank, in file order; the critical path's nodes carry their order on it."""
    origin = _origin(replay)
    on_path = {ri_i: (order, c) for order, (ri_i, c) in
               enumerate(zip(replay.critical_path, replay.contribution, strict=True))}
    rows = []
    for ri, rg in enumerate(replay.ranks):
        det = details[ri] if details is not None else {}
        issue, start, end = replay.issue[ri], replay.start[ri], replay.end[ri]
        for i, nd in enumerate(rg.nodes):
            d = det.get(nd.id)
            measured = nd.measured_start - origin if nd.measured_start else None
            ran = end[i] >= 0
            order, contribution = on_path.get((ri, i), (None, None))
            rows.append({
                "rank": rg.rank, "id": nd.id, "name": nd.name, "type": _type_name(nd.type),
                "kind": d.kind if d is not None else None, "resource": nd.resource,
                "part_of": d.part_of if d is not None else None,
                "measured_start_us": measured,
                "measured_duration_us": nd.measured_duration if nd.measured_start else None,
                "simulated_issue_us": issue[i] if issue[i] >= 0 else None,
                "simulated_start_us": start[i] if start[i] >= 0 else None,
                "simulated_end_us": end[i] if ran else None,
                "simulated_duration_us": end[i] - start[i] if ran else None,
                "start_error_us": issue[i] - measured if measured is not None and issue[i] >= 0 else None,
                "critical_path_order": order, "critical_path_us": contribution,
            })
    return rows


def step_records(replay: Replay, details: Sequence[dict[int, NodeDetail]]) -> list[dict[str, Any]]:
    """One row per `ProfilerStep#N` op of every rank: the op's whole span (its parts and the ops it holds on its
    thread, as the timeline draws it), measured and simulated. A rank without such ops gets one row, step
    WHOLE_RANK, spanning all of its nodes."""
    origin = _origin(replay)
    rows = []
    for ri, rg in enumerate(replay.ranks):
        measured, simulated = op_spans(replay, ri, details[ri], origin)
        steps = [op for op, nd in enumerate(rg.nodes)
                 if nd.name.startswith(STEP_PREFIX) and (op in measured or op in simulated)]
        for op in steps:
            rows.append(_step_row(rg.rank, rg.nodes[op].name, rg.nodes[op].id, measured.get(op), simulated.get(op),
                                  origin))
        if not steps:  # e.g. a host ET recorded outside the profiler's steps: the rank as a whole, said so
            m_all, s_all = list(measured.values()), list(simulated.values())
            m = (min(a for a, _ in m_all), max(b for _, b in m_all)) if m_all else None
            s = (min(a for a, _ in s_all), max(b for _, b in s_all)) if s_all else None
            rows.append(_step_row(rg.rank, WHOLE_RANK, None, m, s, origin))
    return rows


def _step_row(rank: int, step: str, node_id: int | None, m: tuple[float, float] | None,
              s: tuple[float, float] | None, origin: int) -> dict[str, Any]:
    row: dict[str, Any] = {"rank": rank, "step": step, "id": node_id,
                           "measured_start_us": _us(m[0] - origin) if m else None,
                           "measured_duration_us": _us(m[1] - m[0]) if m else None,
                           "simulated_start_us": _us(s[0] - origin) if s else None,
                           "simulated_duration_us": _us(s[1] - s[0]) if s else None,
                           "duration_error_pct": None}
    if m and s and m[1] > m[0]:
        row["duration_error_pct"] = percent((s[1] - s[0]) - (m[1] - m[0]), m[1] - m[0])
    return row


def _us(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def csv_chunks(records: Sequence[dict[str, Any]], columns: Sequence[str]) -> Iterator[bytes]:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for k, row in enumerate(records):
        writer.writerow({c: ("" if row.get(c) is None else row[c]) for c in columns})
        if k % 4096 == 4095:
            yield buf.getvalue().encode()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue().encode()
