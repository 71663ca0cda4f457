"""Process groups as the traces describe them, and the comm-group ids etweave gives them: the one parser of the
host ET `## process_group:init ##` list, Kineto `distributedInfo.pg_config` and the `Process Group Name` /
`Process Group Ranks` event args (`describe_groups`), the ids a single rank's conversion writes
(`local_group_ids`), and the id rule (`assign_group_ids`, docs/FACTS.md §A5)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from enum import Enum

import msgspec
import orjson

from etweave.chakra.accepts import is_group_id
from etweave.read.host_et import HostTrace
from etweave.read.kineto import KinetoTrace


class GroupSource(str, Enum):
    """Where a group description was read (the value is what the convert-run notes print)."""

    HOST = "host"  # the host ET's `## process_group:init ##` node
    PG_CONFIG = "kineto_pg_config"  # Kineto `distributedInfo.pg_config`
    EVENT_ARGS = "kineto_args"  # `Process Group Name` / `Process Group Ranks` args of comm ops and NCCL kernels


class GroupDescription(msgspec.Struct, frozen=True):
    """One process group as one source describes it; plain and picklable (it crosses process boundaries)."""

    name: str | None  # the trace's pg_name; None when the description has none
    ranks: tuple[int, ...] | None  # its global ranks, ascending; () = all ranks; None = not given or unreadable
    size: int | None  # group_size / pg_size when given
    source: GroupSource


def _ranks(value: object) -> tuple[int, ...] | None:
    """A rank list from a description or an event arg (a list, or its JSON text); "all" is all ranks."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    if value == "all":
        return ()
    if isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        return tuple(sorted(value))
    return None


def _size(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _listed(groups: object, source: GroupSource, size_field: str) -> list[GroupDescription]:
    """The descriptions of a list of pg dicts (the readers have checked their `ranks` and sizes)."""
    out = []
    for grp in groups if isinstance(groups, list) else []:
        if isinstance(grp, dict):
            name = grp.get("pg_name")
            out.append(GroupDescription(None if name is None else str(name), _ranks(grp.get("ranks")),
                                        _size(grp.get(size_field)), source))
    return out


def host_groups(host: HostTrace | None) -> list[GroupDescription]:
    return _listed(host.process_groups(), GroupSource.HOST, "group_size") if host is not None else []


def pg_config_groups(kineto: KinetoTrace | None) -> list[GroupDescription]:
    return _listed(kineto.distributed.get("pg_config"), GroupSource.PG_CONFIG, "pg_size") if kineto else []


def event_arg_groups(kineto: KinetoTrace | None) -> Iterator[GroupDescription]:
    """One description per distinct (name, ranks text) the comm ops and NCCL kernels carry."""
    if kineto is None:
        return
    seen: set[tuple[str, str]] = set()
    events = kineto.events
    for i in (*events.cpu, *events.gpu):
        args = events[i].args
        if args.pg_name is None or args.pg_ranks is None:
            continue
        key = (str(args.pg_name), str(args.pg_ranks))
        if key not in seen:
            seen.add(key)
            yield GroupDescription(key[0], _ranks(args.pg_ranks), None, GroupSource.EVENT_ARGS)


def describe_groups(host: HostTrace | None, kineto: KinetoTrace | None) -> list[GroupDescription]:
    """Every description of a rank's traces: host ET, then pg_config, then event args (the order convert-run's
    map keeps the first of conflicting lists in)."""
    return [*host_groups(host), *pg_config_groups(kineto), *event_arg_groups(kineto)]


def local_group_ids(host: HostTrace | None, kineto: KinetoTrace | None) -> dict[str, str]:
    """Trace process-group name -> the comm-group id one rank's conversion writes: "" for a group of all ranks,
    else a decimal id >= 1. Read from the host ET's list, else Kineto's pg_config; a group without a name is
    named by its position."""
    groups = host_groups(host) or pg_config_groups(kineto)
    world = kineto.distributed.get("world_size") if kineto is not None else None
    out: dict[str, str] = {}
    subgroups: list[str] = []
    for n, grp in enumerate(groups):
        name = grp.name if grp.name is not None else str(n)
        # no rank list means the group of all ranks here (a single rank converts without the run's map)
        if not grp.ranks or (isinstance(world, int) and len(grp.ranks) == world):
            out[name] = ""
        else:
            subgroups.append(name)
    out.update(assign_group_ids(subgroups))
    return out


def assign_group_ids(names: Sequence[str]) -> dict[str, str]:
    """Comm-group ids for subgroup names, in the order given: a name that is already an id ASTRA-sim accepts
    (decimal, >= 1, no leading zero) keeps it, the others get the smallest free ids from 1 up (docs/FACTS.md §A5:
    CommunicatorGroup asserts id > 0; PyTorch names its default group "0")."""
    ids: dict[str, str] = {}
    for name in names:
        if is_group_id(name) and str(int(name)) == name:
            ids.setdefault(name, name)
    taken = set(ids.values())
    next_id = 1
    for name in names:
        if name in ids:
            continue
        while str(next_id) in taken:
            next_id += 1
        ids[name] = str(next_id)
        taken.add(ids[name])
    return ids
