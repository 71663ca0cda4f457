"""Read `.et` files and `comm_group.json` into the engine's plain data (the rules of both: `etweave.runfolder`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from sys import intern

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.errors import BadInput
from etweave.runfolder import COMM_GROUP_FILE, file_rank, find_comm_group, read_comm_groups
from etweave.simulate.engine import GraphError, RankGraph, Replay, SimNode, UnknownGroup, replay
from etweave.simulate.pool import load_files
from etweave.simulate.reader import NodeFields, read_nodes

# what the CLI and the Python API import from here; the rules live in etweave.runfolder
__all__ = ["COMM_GROUP_FILE", "find_comm_group", "load_comm_group", "load_rank", "load_ranks", "replay_files",
           "resource_of", "to_sim_node"]
_WANTED = frozenset({"device", "stream", "tid", "pg_name", "comm_src", "comm_dst", "comm_tag",
                     "transfer_duration_micros", "measured_duration_micros", "kind", "part_of"})


def resource_of(attrs: dict[str, object]) -> str | None:
    """GPU stream if the node has `device` and `stream`, else CPU thread `tid`, else none (see docs/OUTPUT.md)."""
    if "device" in attrs and "stream" in attrs:
        return f"gpu{attrs['device']}:stream{attrs['stream']}"
    if "tid" in attrs:
        return f"cpu:tid{attrs['tid']}"
    return None


def attr_int(value: object, path: Path, node_id: int, name: str) -> int:
    """An attr read as an integer (a finite number): anything else is bad input naming the node and attr."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value in (_INF, -_INF):
        raise BadInput(path, f"node {node_id}: attr {name} is {value!r}, not a finite number")
    return int(value)


_INF = float("inf")


_SPECIAL_TYPES = frozenset({*COMM_NODE_TYPES, pb.METADATA_NODE})  # durations and attrs of their own


def to_sim_node(fields: NodeFields, path: Path) -> SimNode:
    """One node as the replay takes it (`_sim_nodes` builds most nodes itself, by the same rules)."""
    # Names, kinds and resource labels are interned: a rank repeats a few hundred of them over thousands of
    # nodes, and a run repeats them over its ranks, so they cost memory per distinct string, not per node.
    node_id, name, ntype, deps, start, duration, attrs = fields
    kind = attrs.get("kind", "")
    # kind: what `etweave simulate --scale/--set-duration` select by and step times are bounded by (whatif.py,
    # steps.py)
    kind = intern(kind if type(kind) is str else str(kind))
    resource = resource_of(attrs)
    if ntype in _SPECIAL_TYPES or "measured_duration_micros" in attrs:
        sim = _special_node(node_id, name, ntype, deps, start, duration, attrs, path)
        sim.kind, sim.resource = kind, intern(resource) if resource is not None else None
        return sim
    # most nodes: a compute node whose measured duration is its duration
    sim = SimNode(node_id, intern(name), ntype, deps, duration, intern(resource) if resource is not None else None,
                  start, duration, None, None, None, None, kind)
    if "part_of" in attrs:
        part_of = attrs["part_of"]
        sim.part_of = part_of if type(part_of) is int else attr_int(part_of, path, node_id, "part_of")
    return sim


def _sim_nodes(nodes: Iterator[NodeFields], path: Path) -> list[SimNode]:
    """`to_sim_node` of every node, written out for the usual compute node whose kind is a string and whose
    resource is a thread with an integer id (most nodes): this runs for every node of every rank."""
    out: list[SimNode] = []
    append = out.append
    thread_labels: dict[int, str] = {}  # tid -> its interned label
    special = _SPECIAL_TYPES
    for fields in nodes:
        node_id, name, ntype, deps, start, duration, attrs = fields
        kind = attrs.get("kind", "")
        tid = attrs.get("tid")
        if (ntype in special or type(kind) is not str or type(tid) is not int or "device" in attrs
                or "measured_duration_micros" in attrs):
            append(to_sim_node(fields, path))
            continue
        label = thread_labels.get(tid)
        if label is None:
            label = thread_labels[tid] = intern(f"cpu:tid{tid}")
        sim = SimNode(node_id, name, ntype, deps, duration, label, start, duration, None, None, None, None, kind)
        if "part_of" in attrs:
            part_of = attrs["part_of"]
            sim.part_of = part_of if type(part_of) is int else attr_int(part_of, path, node_id, "part_of")
        append(sim)
    return out


def _special_node(node_id: int, name: str, ntype: int, deps: tuple[int, ...], start: int, duration: int,
                  attrs: dict[str, object], path: Path) -> SimNode:
    """A comm or metadata node, or one with a measured duration of its own: all but its kind and resource."""
    measured_duration = duration
    if ntype in COMM_NODE_TYPES and "transfer_duration_micros" in attrs:
        # the measured duration of a comm node includes waiting for peers; the replay models that wait itself
        duration = attr_int(attrs["transfer_duration_micros"], path, node_id, "transfer_duration_micros")
    elif ntype == pb.METADATA_NODE:
        duration = 0  # metadata nodes take no time (docs/OUTPUT.md)
    measured = attrs.get("measured_duration_micros")
    if measured is not None:
        # whole-run conversion shortens a comm node to its transfer time; the measured one is kept as an attr
        measured_duration = attr_int(measured, path, node_id, "measured_duration_micros")
    sim = SimNode(node_id, intern(name), ntype, deps, duration, None, start, measured_duration)
    if "part_of" in attrs:
        sim.part_of = attr_int(attrs["part_of"], path, node_id, "part_of")
    if ntype == pb.COMM_COLL_NODE:
        pg = attrs.get("pg_name", "")
        sim.pg = intern(pg if isinstance(pg, str) else str(pg))
    elif ntype in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        for attr in ("comm_src", "comm_dst", "comm_tag"):
            if attr in attrs:
                setattr(sim, attr, attr_int(attrs[attr], path, node_id, attr))
    return sim


def load_rank(path: Path, default_rank: int | None = None) -> RankGraph:
    """One `.et` file, its rank by `etweave.runfolder.file_rank` (the name `<prefix>.<rank>.et`, else the
    GlobalMetadata attr `rank`, else `default_rank`)."""
    metadata, nodes = read_nodes(path, _WANTED)  # a chunk of the file at a time, only the fields the replay reads
    rank = file_rank(metadata, path, default_rank)
    return RankGraph(rank=rank, nodes=_sim_nodes(nodes, path), source=str(path))


def load_ranks(files: Sequence[Path], default_rank: int | None = None, jobs: int = 1) -> list[RankGraph]:
    """`load_rank` of every file; with `jobs` > 1, read by this process and `jobs` - 1 workers side by side
    (`etweave.simulate.pool`)."""
    return load_files(files, load_rank, RankGraph, intern_strings, default_rank, jobs)


def intern_strings(rank: RankGraph) -> RankGraph:
    """A rank decoded from msgpack (`etweave.simulate.pool`) with its names, kinds, resource labels and group names
    interned again, as `load_rank` leaves them: memory per distinct string, not per node."""
    for nd in rank.nodes:
        nd.name = intern(nd.name)
        nd.kind = intern(nd.kind)
        if nd.resource is not None:
            nd.resource = intern(nd.resource)
        if nd.pg:
            nd.pg = intern(nd.pg)
    return rank


def load_comm_group(path: Path) -> dict[str, list[int]]:
    """The id -> ranks map of a comm-group file, read and checked by `etweave.runfolder.read_comm_groups`."""
    return read_comm_groups(path).members


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
