"""Read `.et` files and `comm_group.json` into the engine's plain data."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from sys import intern

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import attr_value, iter_et
from etweave.errors import BadInput
from etweave.read.source import read_plain
from etweave.simulate.engine import GraphError, RankGraph, Replay, SimNode, UnknownGroup, replay

COMM_GROUP_FILE = "comm_group.json"
_RANK_IN_NAME = re.compile(r"\.(\d+)\.et(?:\.gz)?$")
_COMM_TYPES = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
_WANTED = frozenset({"device", "stream", "tid", "pg_name", "comm_src", "comm_dst", "comm_tag",
                     "transfer_duration_micros", "measured_duration_micros", "kind", "part_of"})


_LIST_FIELDS = frozenset(f.name for f in pb.AttributeProto.DESCRIPTOR.oneofs_by_name["value"].fields
                         if f.name.endswith("_list"))


def resource_of(attrs: dict[str, object]) -> str | None:
    """GPU stream if the node has `device` and `stream`, else CPU thread `tid`, else none (see docs/OUTPUT.md)."""
    if "device" in attrs and "stream" in attrs:
        return f"gpu{attrs['device']}:stream{attrs['stream']}"
    if "tid" in attrs:
        return f"cpu:tid{attrs['tid']}"
    return None


def _int(value: object, path: Path, node_id: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value in (_INF, -_INF):
        raise BadInput(path, f"node {node_id}: attr {name} is {value!r}, not a finite number")
    return int(value)


_INF = float("inf")


def to_sim_node(node: pb.Node, path: Path) -> SimNode:
    # Names, kinds and resource labels are interned: a rank repeats a few hundred of them over thousands of
    # nodes, and a run repeats them over its ranks, so they cost memory per distinct string, not per node.
    # pick only the attrs the replay reads: node_attrs() would build a dict of every attr per node
    attrs: dict[str, object] = {}
    for a in node.attr:
        name = a.name
        if name in _WANTED:
            which = a.WhichOneof("value")  # attr_value, inlined: this loop runs for every attr of every node
            value = getattr(a, which) if which is not None else None
            attrs[name] = list(value.values) if which in _LIST_FIELDS else value
    ntype = node.type
    duration = node.duration_micros
    if ntype in _COMM_TYPES and "transfer_duration_micros" in attrs:
        # the measured duration of a comm node includes waiting for peers; the replay models that wait itself
        duration = _int(attrs["transfer_duration_micros"], path, node.id, "transfer_duration_micros")
    elif ntype == pb.METADATA_NODE:
        duration = 0  # metadata nodes take no time (docs/OUTPUT.md)
    resource = resource_of(attrs)
    measured = attrs.get("measured_duration_micros")
    sim = SimNode(
        id=node.id,
        name=intern(node.name),
        type=ntype,
        deps=(*node.data_deps, *node.ctrl_deps),
        duration=duration,
        resource=intern(resource) if resource is not None else None,
        measured_start=node.start_time_micros,
        # whole-run conversion shortens a comm node to its transfer time; the measured one is kept as an attr
        measured_duration=node.duration_micros if measured is None else _int(
            measured, path, node.id, "measured_duration_micros"),
    )
    # what `etweave simulate --scale/--set-duration` select by and step times are bounded by (whatif.py, steps.py)
    kind = attrs.get("kind", "")
    sim.kind = intern(kind if isinstance(kind, str) else str(kind))
    if "part_of" in attrs:
        sim.part_of = _int(attrs["part_of"], path, node.id, "part_of")
    if ntype == pb.COMM_COLL_NODE:
        pg = attrs.get("pg_name", "")
        sim.pg = intern(pg if isinstance(pg, str) else str(pg))
    elif ntype in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        for name in ("comm_src", "comm_dst", "comm_tag"):
            if name in attrs:
                setattr(sim, name, _int(attrs[name], path, node.id, name))
    return sim


def rank_from_name(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def load_rank(path: Path, default_rank: int | None = None) -> RankGraph:
    """One `.et` file. Rank: GlobalMetadata attr `rank`, else `<prefix>.<rank>.et`, else `default_rank`."""
    metadata, nodes = iter_et(path)  # one protobuf node at a time: only the SimNodes stay
    rank = trace_rank(metadata, path, default_rank)
    return RankGraph(rank=rank, nodes=[to_sim_node(nd, path) for nd in nodes], source=str(path))


def trace_rank(metadata: pb.GlobalMetadata, path: Path, default_rank: int | None = None) -> int:
    """GlobalMetadata attr `rank`, else `<prefix>.<rank>.et`, else `default_rank`."""
    rank: int | None = None
    for a in metadata.attr:
        if a.name == "rank":
            value = attr_value(a)
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadInput(path, f"GlobalMetadata attr rank is {value!r}, not an integer")
            rank = value
    if rank is None:
        rank = rank_from_name(path)
    if rank is None:
        rank = default_rank
    if rank is None:
        raise BadInput(path, "no rank: neither a GlobalMetadata attr `rank` nor a name like <prefix>.<rank>.et")
    return rank


def find_comm_group(traces: Sequence[Path]) -> Path | None:
    """`comm_group.json` beside the first trace that has one."""
    for trace in traces:
        candidate = Path(trace).parent / COMM_GROUP_FILE
        if candidate.is_file():
            return candidate
    return None


def load_comm_group(path: Path) -> dict[str, list[int]]:
    """`{"<decimal id>": [global ranks, ...]}`."""
    try:
        data = json.loads(read_plain(Path(path)))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the stdlib parser goes
        raise BadInput(path, f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadInput(path, "expected an object mapping group ids to lists of ranks")
    groups: dict[str, list[int]] = {}
    for key, ranks in data.items():
        if not key.isdecimal():
            raise BadInput(path, f"group id {key!r} is not a decimal number")
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise BadInput(path, f"group {key}: expected a list of integer ranks")
        groups[key] = ranks
    return groups


def replay_files(ranks: list[RankGraph], groups: dict[str, list[int]], files: Sequence[Path],
                 group_file: Path | None, group_option: str = "--comm-group") -> Replay:
    """`replay` of loaded files, a graph the replay cannot run (an unknown group, a bad edge) reported as bad
    input naming the file; the one home for that mapping (the CLI and `etweave.simulate_files`)."""
    try:
        return replay(ranks, groups)
    except GraphError as exc:
        where = ranks[exc.rank_index].source if exc.rank_index is not None else ", ".join(map(str, files))
        problem = exc.problem
        if isinstance(exc, UnknownGroup):
            hint = str(group_file) if group_file else f"no {COMM_GROUP_FILE} beside the traces: pass {group_option}"
            problem += f" ({hint})"
        raise BadInput(where, problem) from exc
