"""Stage repair_parents: give every host op a place in a tree. Orphans (parent id not in the file) are attached under
their own thread's root, or under a synthesized thread root when the host ET has none for that thread."""

from __future__ import annotations

import itertools
import operator
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec

from etweave.model import Ids
from etweave.read.host_et import PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, HostOp


class MissingParent(msgspec.Struct):
    id: int
    thread: int
    orphans: list[int]  # host op ids directly below the missing id
    nodes_below: int  # every host op in the subtrees hanging below the missing id
    collectives: list[str]  # names of the collective calls among them


class Repair(msgspec.Struct):
    parent_of: dict[int, int | None]  # host op id -> effective parent id (a host id or a synthesized root id)
    thread_root_of: dict[int, int]  # host ET tid -> the root id of that thread (existing or synthesized)
    synthesized_roots: dict[int, int] = msgspec.field(default_factory=dict)  # host ET tid -> synthesized root id
    missing: list[MissingParent] = msgspec.field(default_factory=list)
    orphan_parent: dict[int, int] = msgspec.field(default_factory=dict)  # orphan id -> the missing parent id
    cycles: int = 0  # parent cycles in the host ET (an observer bug), each broken at its smallest id


COLLECTIVE_CALL_PREFIX = "c10d::"  # every collective call's name starts so (etweave.collectives picks calls by it)


def is_collective_call(op: HostOp) -> bool:
    """A c10d collective or p2p call (not `wait`, not the process-group bookkeeping)."""
    if not op.name.startswith(COLLECTIVE_CALL_PREFIX):
        return False
    base = op.name[len(COLLECTIVE_CALL_PREFIX):].rstrip("_")
    return base not in ("wait", "") and not base.startswith(("allreduce_coalesced_wait", "_wait"))


def repair(ops: Sequence[HostOp], ids: Ids) -> Repair:
    """Every op's effective parent; synthesized thread roots take their ids from `ids`."""
    names = list(map(_NAME, ops))
    thread_root_of: dict[int, int] = {}
    for op in itertools.compress(ops, map(_THREAD_ROOT_NAMES.__contains__, names)):  # (is_thread_root, in C)
        thread_root_of.setdefault(op.et_tid, op.id)
    rep = Repair({}, thread_root_of)
    # the children: only for the orphans' subtrees and the cycles broken (None: nothing missing, asked only if a
    # cycle is broken, and then of no use)
    children: dict[int, list[int]] | None = None
    missing: dict[int, list[HostOp]] = {}
    recorded = _all_recorded(ops, names, rep.parent_of)  # None: some op's parent is not in the file
    if recorded is None:
        children, missing = _recorded_parents(ops, rep.parent_of)
    for missing_id in sorted(missing):
        for op in missing[missing_id]:
            root = thread_root_of.get(op.et_tid)
            if root is None:
                root = thread_root_of[op.et_tid] = rep.synthesized_roots[op.et_tid] = ids.next()
            rep.parent_of[op.id] = root
            rep.orphan_parent[op.id] = missing_id
    rep.cycles = 0 if recorded else _break_cycles(ops, rep.parent_of, children, thread_root_of)
    if missing:
        by_id = {op.id: op for op in ops}
        assert children is not None  # (found with the missing parents)
        rep.missing = [_missing_parent(missing_id, missing[missing_id], children, by_id)
                       for missing_id in sorted(missing)]
    return rep


_NAME, _ID, _PARENT = operator.attrgetter("name"), operator.attrgetter("id"), operator.attrgetter("parent")
_THREAD_ROOT_NAMES, _ROOT_NAMES = frozenset(THREAD_ROOT_NAMES), frozenset(PROCESS_ROOT_NAMES + THREAD_ROOT_NAMES)


def _all_recorded(ops: Sequence[HostOp], names: list[str], parent_of: dict[int, int | None]) -> bool | None:
    """`_recorded_parents`' parents in C passes where every op but the roots has its parent in the file (most
    traces, every Kineto-only conversion): None, nothing set, where one has not. Else whether every parent's id is
    below its child's (ids handed out at op entry: most traces), which proves there is no cycle (`_break_cycles`
    tells the same from the dict; here from the lists at hand)."""
    op_ids, parents = list(map(_ID, ops)), list(map(_PARENT, ops))
    known = set(op_ids)
    is_root = list(map(_ROOT_NAMES.__contains__, names))
    not_root = list(map(operator.not_, is_root))
    if not all(itertools.compress(map(known.__contains__, parents), not_root)):
        return None
    parent_of.update(zip(op_ids, parents, strict=True))
    ascending = all(map(operator.lt, itertools.compress(parents, not_root), itertools.compress(op_ids, not_root)))
    process_root = next((op.id for op in ops if op.name in PROCESS_ROOT_NAMES), None)
    for op in itertools.compress(ops, is_root):  # the roots as `_recorded_parents` reads them
        if op.name in PROCESS_ROOT_NAMES:
            parent_of[op.id] = None
        elif op.parent != op.id and op.parent not in known:
            parent_of[op.id] = process_root
        parent = parent_of[op.id]
        ascending = ascending and (parent is None or parent < op.id)
    return ascending


def _recorded_parents(ops: Sequence[HostOp], parent_of: dict[int, int | None]) -> tuple[
        dict[int, list[int]], dict[int, list[HostOp]]]:
    """Sets the parent of every op whose parent is in the file (a thread root without one: the process root);
    returns the children of each op and the orphans below each missing parent id."""
    known = {op.id for op in ops}
    process_root = next((op.id for op in ops if op.is_process_root), None)
    children: dict[int, list[int]] = defaultdict(list)
    missing: dict[int, list[HostOp]] = defaultdict(list)
    for op in ops:
        if op.name in PROCESS_ROOT_NAMES:  # (is_process_root, inline: one call less per op)
            parent_of[op.id] = None
        elif op.parent == op.id:  # a one-node parent cycle: broken below like the longer ones
            parent_of[op.id] = op.id
        elif op.parent in known:
            parent_of[op.id] = op.parent
            children[op.parent].append(op.id)
        elif op.name in THREAD_ROOT_NAMES:  # is_thread_root
            parent_of[op.id] = process_root
        else:
            missing[op.parent].append(op)
    return children, missing


def _missing_parent(missing_id: int, orphans: list[HostOp], children: dict[int, list[int]],
                    by_id: dict[int, HostOp]) -> MissingParent:
    """What hangs below a missing parent id: its orphans, every op in their subtrees, the collective calls."""
    below: list[int] = []
    stack = [op.id for op in orphans]
    while stack:  # iterative: a deep tree must not hit the recursion limit
        nid = stack.pop()
        below.append(nid)
        stack.extend(children.get(nid, ()))
    return MissingParent(
        id=missing_id,
        thread=orphans[0].et_tid,
        orphans=[op.id for op in orphans],
        nodes_below=len(below),
        collectives=sorted(by_id[n].name for n in below if is_collective_call(by_id[n])),
    )


def _break_cycles(ops: Sequence[HostOp], parent_of: dict[int, int | None], children: dict[int, list[int]] | None,
                  thread_root_of: dict[int, int]) -> int:
    """Each op has at most one parent, so a cycle is found by walking up with three colours, O(N)."""
    # Where every parent's id is below its child's (ids handed out at op entry: most traces), every walk up ends:
    # no cycle, told by one pass in C
    parents: list[Any] = list(parent_of.values())  # (ints where has_parent: compared only there)
    kids = list(parent_of)
    has_parent = list(map(operator.is_not, parents, itertools.repeat(None)))
    if all(map(operator.lt, itertools.compress(parents, has_parent), itertools.compress(kids, has_parent))):
        return 0
    state: dict[int, int] = {}  # 1 = on the current walk, 2 = done
    by_id: dict[int, HostOp] = {}  # made at the first cycle (most traces have none)
    cycles = 0
    for start in sorted(parent_of):
        path: list[int] = []
        node: int | None = start
        while node is not None and state.get(node) is None and node in parent_of:
            state[node] = 1
            path.append(node)
            node = parent_of[node]
        if node is not None and state.get(node) == 1:  # walked back onto this path: a cycle
            loop = path[path.index(node):]
            cut = min(loop)
            by_id = by_id or {op.id: op for op in ops}
            old = parent_of[cut]
            root = thread_root_of.get(by_id[cut].et_tid)
            parent_of[cut] = root if root != cut else None
            if children is not None and old is not None and cut in children.get(old, []):
                children[old].remove(cut)
            cycles += 1
        for n in path:
            state[n] = 2
    return cycles
