"""What a replay of the files given lacks, said in the summary: ranks of the run not given (their collectives are
not waited for), and collectives whose durations still hold the wait for their peers (ranks converted one at a time
with `etweave convert`, then replayed together: the replay's rendezvous waits for the peers again)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from itertools import compress
from operator import attrgetter, eq
from pathlib import Path

import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.runfolder import REPORT_FILE, split_rank_name
from etweave.simulate.engine import RankGraph, SimNode

_type_of = attrgetter("type")
_is_collective = partial(eq, pb.COMM_COLL_NODE)


def run_ranks(files: Sequence[Path]) -> tuple[set[int], str] | None:
    """The global ranks of the whole run the files come from, and where that was read: the `ranks` of the
    convert-run report.json beside the first file, else every `<prefix>.<rank>.et` beside the files given."""
    if not files:
        return None
    folder = Path(files[0]).parent
    report = folder / REPORT_FILE
    try:
        data = orjson.loads(report.read_bytes()) if report.is_file() else None
    except (OSError, orjson.JSONDecodeError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("ranks"), dict) and "cross_rank" in data:
        ranks = {int(r) for r in data["ranks"] if str(r).isdigit()}
        if ranks:
            return ranks, str(report)
    prefixes = {named[0] for f in files if (named := split_rank_name(f))}
    if len(prefixes) != 1:
        return None
    prefix = prefixes.pop()
    found = {named[1] for p in folder.iterdir() if (named := split_rank_name(p)) and named[0] == prefix}
    return (found, f"the {prefix}.<rank>.et files in {folder}") if found else None


def _span(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f", ... ({len(ranks)} in all)" if len(ranks) > 8 else "")


def missing_members(given: Sequence[RankGraph], run: tuple[set[int], str] | None) -> list[str]:
    """A line when the ranks given issue world-group collectives and the run has ranks not given. (A listed
    subgroup's missing members are noted by the replay itself: etweave/simulate/engine.py.)"""
    have = {rg.rank for rg in given}
    if run is None:
        return []
    missing = sorted(run[0] - have)
    if not missing or not any(nd.type == pb.COMM_COLL_NODE and not nd.pg for rg in given for nd in rg.nodes):
        return []  # (the ranks first: the collectives are a pass over every node)
    return [f"{len(missing)} member(s) of the world group are missing (rank(s) {_span(missing)}; the run's ranks "
            f"from {run[1]}): their collectives are not waited for"]


def missing_ranks(have: Sequence[int], run: tuple[set[int], str] | None) -> str | None:
    """A line naming the ranks of the run not among those given, or None."""
    if run is None:
        return None
    missing = sorted(run[0] - set(have))
    if not missing:
        return None
    return (f"{len(missing)} rank(s) of the run are not among the files given: {_span(missing)} (the run's ranks "
            f"from {run[1]}); their collectives and sends/recvs are not checked against them")


def unadjusted_collectives(ranks: Sequence[RankGraph]) -> str | None:
    """Collectives whose stored durations still include the wait for the slowest peer, in a replay of several
    ranks. `etweave convert-run` cuts each to its end minus the latest start among the members
    (transfer_duration_micros), keeping the measured one (measured_duration_micros); a node loaded without
    either has its duration equal to its measured duration. An instance counts when every member is like that
    and that cut would shorten one of them, with the same conditions as convert-run's (etweave/run/cross_rank.py):
    every start measured, the members overlapping."""
    if len(ranks) < 2:
        return None
    instances = counted = 0
    extra = 0
    for by_rank in _collectives_in_issue_order(ranks).values():
        if len(by_rank) < 2:
            continue
        for k in range(min(len(v) for v in by_rank.values())):
            instances += 1
            waits = _peer_waits([ranks[ri].nodes[lst[k]] for ri, lst in by_rank.items()])
            if max(waits, default=0) > 0:
                counted += 1
                extra += sum(w for w in waits if w > 0)
    if not counted:
        return None
    return (f"{counted} of {instances} collectives keep the wait for their slowest peer in their durations "
            f"({extra} us over all members; no transfer_duration_micros: the ranks were not converted together), "
            "and the replay waits for the peers again: convert the ranks together with `etweave convert-run`")


def _collectives_in_issue_order(ranks: Sequence[RankGraph]) -> dict[str, dict[int, list[int]]]:
    """Per process group and rank (an index into `ranks`), the indices of its collective nodes in issue order."""
    per_pg: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for ri, rg in enumerate(ranks):
        nodes = rg.nodes
        for i in compress(range(len(nodes)), map(_is_collective, map(_type_of, nodes))):  # picked in C
            per_pg[nodes[i].pg or ""][ri].append(i)
    for by_rank in per_pg.values():
        for ri, lst in by_rank.items():
            nodes = ranks[ri].nodes
            lst.sort(key=lambda i: nodes[i].id)  # issue order = ascending id, as the replay
    return per_pg


def _peer_waits(members: list[SimNode]) -> list[int]:
    """How much of each member's duration convert-run's cut would remove (the wait for the slowest peer); empty
    when the cut does not apply: a start not measured, a duration already cut, or members that do not overlap."""
    if any(nd.measured_start <= 0 or nd.duration != nd.measured_duration for nd in members):
        return []
    latest = max(nd.measured_start for nd in members)
    if latest >= min(nd.measured_start + nd.measured_duration for nd in members):
        return []
    return [nd.duration - max(1, nd.measured_start + nd.measured_duration - latest) for nd in members]
