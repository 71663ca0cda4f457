"""What-if edits: change the loaded graphs' durations before a replay (`etweave simulate --scale/--set-duration/
--comm-bandwidth`, or `apply(ranks, edits)` from Python).

An edit is a selector and a number, written `SELECTOR:NUMBER`; the selector is `key=value` terms joined by `,`,
all of which must hold:

- `name=GLOB` an op whose name matches the glob (fnmatch, case-sensitive), with all of its time: its node and its
  `[self]`/`[resumed]` parts (attr `part_of`), whatever their own names;
- `kind=K` `cpu` (host ops, runtime calls and their parts), `gpu` (kernels, GPU copies and memsets), `comm`
  (communication nodes), or any value of the node attr `kind` (`host_op`, `kernel`, `delay`, ...); `cpu` and `gpu`
  never select delays: no op of the run stands behind them;
- `rank=LIST` global ranks, e.g. `0,2-3` (`+` also separates: `rank=0+2`);
- `step=LIST` nodes whose measured start lies in `ProfilerStep#N` of their rank (from the step op's measured start
  to its last part's measured end, any thread of the rank).

Actions, applied in the order given, each to the durations left by the previous ones:

- `scale SELECTOR:FACTOR` multiplies each selected node's duration by FACTOR (>= 0);
- `set-duration SELECTOR:MICROS` gives each selected op MICROS µs in all, spread over its node and parts in
  proportion to their current durations (all on the op's own node when they are all 0);
- `comm-bandwidth [SELECTOR:]FACTOR` communication FACTOR times as fast: selected communication nodes' durations
  (the transfer time where `convert-run` measured one) divided by FACTOR (> 0).

Only the simulated `duration` changes: each node's measured start and duration stay as loaded, so the replay is
still compared with the measured (unedited) run. Metadata nodes (process and thread roots) are never selected. An
edit that selects no node is bad input (a typo would otherwise predict "no change").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from etweave.chakra.accepts import COMM_NODE_TYPES
from etweave.errors import BadInput
from etweave.nodes import is_marker_node
from etweave.simulate.engine import RankGraph, SimNode
from etweave.simulate.steps import PART_KINDS, step_bounds

ACTIONS = ("scale", "set-duration", "comm-bandwidth")
KEYS = ("name", "kind", "rank", "step")
# node attr `kind` values that stand for measured work of each class (delays stand for none: never scaled by class)
_CPU_KINDS = frozenset({"host_op", "runtime", "self_part", "resume"})
_GPU_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True, slots=True)
class Selector:
    name: str | None = None
    kind: str | None = None
    ranks: frozenset[int] | None = None
    steps: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class Edit:
    action: str  # one of ACTIONS
    selector: Selector
    value: float  # factor (scale, comm-bandwidth) or µs (set-duration)
    text: str  # as the user wrote it, for messages

    @property
    def label(self) -> str:
        return f"--{self.action} {self.text}"


@dataclass(frozen=True, slots=True)
class EditResult:
    edit: Edit
    nodes: int  # nodes whose duration the edit set (changed or not)
    ops: int  # ops (a node with its parts) among them
    before_us: int  # their durations before the edit, summed
    after_us: int

    @property
    def added_us(self) -> int:
        return self.after_us - self.before_us


def _ints(text: str, key: str, where: str) -> frozenset[int]:
    out: set[int] = set()
    for part in re.split(r"[+,]", text):
        m = _RANGE.match(part.strip())
        if not m:
            raise BadInput(where, f"{key}={text!r}: expected numbers or ranges like 0,2-3")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise BadInput(where, f"{key}={text!r}: range {part} is empty")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def parse_selector(text: str, where: str) -> Selector:
    """`key=value,...` -> Selector. A `name=` glob may itself contain commas only as the last term."""
    fields: dict[str, str] = {}
    rest = text.strip()
    while rest:
        key, eq, tail = rest.partition("=")
        key = key.strip()
        if not eq or key not in KEYS:
            raise BadInput(where, f"selector term {rest.split(',')[0]!r}: expected key=value with key one of "
                                  f"{', '.join(KEYS)}")
        if key in fields:
            raise BadInput(where, f"selector gives {key}= twice")
        # the value runs to the next `,key=` (so a name glob may hold commas or colons)
        m = re.search(r",\s*(?:" + "|".join(KEYS) + r")=", tail)
        value, rest = (tail[:m.start()], tail[m.start() + 1:]) if m else (tail, "")
        fields[key] = value.strip()
        rest = rest.strip()
    if not fields:
        raise BadInput(where, "empty selector: give at least one of name=, kind=, rank=, step=")
    if "name" in fields and not fields["name"]:
        raise BadInput(where, "name= is empty")
    if "kind" in fields and not fields["kind"]:
        raise BadInput(where, "kind= is empty")
    return Selector(
        name=fields.get("name"),
        kind=fields.get("kind"),
        ranks=_ints(fields["rank"], "rank", where) if "rank" in fields else None,
        steps=_ints(fields["step"], "step", where) if "step" in fields else None,
    )


def parse_edit(action: str, text: str) -> Edit:
    """One command-line edit: `SELECTOR:NUMBER` (comm-bandwidth: `[SELECTOR:]FACTOR`). BadInput on a bad one."""
    if action not in ACTIONS:
        raise ValueError(f"unknown what-if action {action!r}")
    where = f"--{action} {text}"
    selector_text, colon, number = text.rpartition(":")
    if not colon and action != "comm-bandwidth":
        raise BadInput(where, "expected SELECTOR:NUMBER, e.g. 'name=aten::mm:2' or 'kind=gpu,rank=0:0.5'")
    try:
        value = float(number)
    except ValueError:
        raise BadInput(where, f"{number!r} is not a number (expected SELECTOR:NUMBER)") from None
    if not math.isfinite(value) or value < 0 or (action == "comm-bandwidth" and value == 0):
        raise BadInput(where, f"{number!r}: expected a finite number >= 0" + (" and > 0" if action ==
                                                                                    "comm-bandwidth" else ""))
    selector = parse_selector(selector_text, where) if colon else Selector(kind="comm")
    if action == "comm-bandwidth":
        if selector.kind not in (None, "comm"):
            raise BadInput(where, "comm-bandwidth selects communication nodes only: drop kind=")
        selector = Selector(selector.name, "comm", selector.ranks, selector.steps)
    return Edit(action, selector, value, text)


def _kind_matches(node: SimNode, kind: str) -> bool:
    if kind == "comm":
        return node.type in COMM_NODE_TYPES
    if kind == "cpu":
        return node.type not in COMM_NODE_TYPES and node.kind in _CPU_KINDS
    if kind == "gpu":
        return node.type not in COMM_NODE_TYPES and node.kind in _GPU_KINDS
    return node.kind == kind


def select(rank: RankGraph, selector: Selector) -> list[list[int]]:
    """Indices of the selected nodes of one rank, grouped by op (an op's node first, then its parts)."""
    if selector.ranks is not None and rank.rank not in selector.ranks:
        return []
    nodes = rank.nodes
    windows: list[tuple[int, int]] = []
    if selector.steps is not None:
        bounds = step_bounds(nodes)
        windows = [(lo, hi) for step, (lo, hi) in bounds.items() if step in selector.steps]
    index_of = {nd.id: i for i, nd in enumerate(nodes)}

    def owner(i: int) -> int:
        nd = nodes[i]
        if nd.kind in PART_KINDS and nd.part_of in index_of:
            return index_of[nd.part_of]
        return i

    groups: dict[int, list[int]] = {}
    for i, nd in enumerate(nodes):
        if is_marker_node(nd.type, nd.kind):  # roots take no time in any replay (docs/OUTPUT.md): nothing to edit
            continue
        o = owner(i)
        if selector.name is not None and not fnmatchcase(nodes[o].name, selector.name):
            continue
        if selector.kind is not None and not _kind_matches(nd, selector.kind):
            continue
        if selector.steps is not None and not (nd.measured_start and any(lo <= nd.measured_start < hi
                                                                          for lo, hi in windows)):
            continue
        groups.setdefault(o, []).append(i)
    return [sorted(g, key=lambda i: (i != o, i)) for o, g in sorted(groups.items())]


def _spread(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights` (all on the first when they sum to 0); sums exactly to total."""
    whole = sum(weights)
    if whole <= 0:
        return [total] + [0] * (len(weights) - 1)
    out, acc, given = [], 0, 0
    for w in weights:
        acc += w
        share = round(total * acc / whole) - given
        out.append(share)
        given += share
    return out


def apply(ranks: Sequence[RankGraph], edits: Sequence[Edit]) -> list[EditResult]:
    """Apply `edits` in order to the nodes' simulated durations, in place. BadInput if an edit selects nothing."""
    results = []
    for edit in edits:
        nodes = ops = before = after = 0
        for rg in ranks:
            for group in select(rg, edit.selector):
                olds = [rg.nodes[i].duration for i in group]
                if edit.action == "set-duration":
                    news = _spread(round(edit.value), olds)
                elif edit.action == "scale":
                    news = [round(d * edit.value) for d in olds]
                else:  # comm-bandwidth
                    news = [round(d / edit.value) for d in olds]
                for i, d in zip(group, news, strict=True):
                    rg.nodes[i].duration = d
                nodes += len(group)
                ops += 1
                before += sum(olds)
                after += sum(news)
        if nodes == 0:
            raise BadInput(edit.label, f"selects no node in {len(ranks)} rank(s)")
        results.append(EditResult(edit, nodes, ops, before, after))
    return results


def describe(results: Sequence[EditResult]) -> list[dict[str, object]]:
    """JSON-able summary of applied edits."""
    return [{"edit": r.edit.label, "nodes": r.nodes, "ops": r.ops, "before_us": r.before_us, "after_us": r.after_us,
             "added_us": r.added_us} for r in results]
