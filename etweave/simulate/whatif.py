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
- `comm-bandwidth [SELECTOR:]FACTOR` communication FACTOR times as fast (> 0), from a fit, not node by node: for each
  (process group, collective kind) — ALL_REDUCE, ..., SEND, RECV; point-to-point nodes have no group — the
  graph's transfer times (each comm node's duration: the transfer time where `convert-run` measured one) are fitted
  as `latency + bytes × time per byte` (`fit_transfers`: robust, Theil-Sen over the median time of each size, so
  one slow transfer sets nothing), and each selected node loses the part of its fitted bandwidth time that a
  network FACTOR times as fast saves: `duration − bytes × time per byte × (1 − 1/FACTOR)`. Its latency and its own
  deviation from the fit stay as measured (noise is neither multiplied nor divided), and FACTOR 1 changes nothing.
  Where a group has one size only, or its times do not grow with size, latency and bandwidth cannot be told apart
  and all of its time counts as bandwidth (its median time per byte). A node whose size is unknown (attr
  `comm_size` 0 or absent) is divided by FACTOR and counted (`unfitted_nodes`). The per-node form, each node's own
  measured time divided by F, is `scale kind=comm:X` with X = 1/F (e.g. `0.25` for F = 4).

Only the simulated `duration` changes: each node's measured start and duration stay as loaded, so the replay is
still compared with the measured (unedited) run. Metadata nodes (process and thread roots) are never selected. An
edit that selects no node is bad input (a typo would otherwise predict "no change").
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

import msgspec

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import COMM_NODE_TYPES, comm_type_name
from etweave.errors import BadInput
from etweave.nodes import is_marker_node
from etweave.simulate.engine import RankGraph, SimNode
from etweave.simulate.load import attr_int
from etweave.simulate.reader import read_nodes
from etweave.simulate.steps import PART_KINDS, step_bounds

ACTIONS = ("scale", "set-duration", "comm-bandwidth")
KEYS = ("name", "kind", "rank", "step")
# node attr `kind` values that stand for measured work of each class (delays stand for none: never scaled by class)
_CPU_KINDS = frozenset({"host_op", "runtime", "self_part", "resume"})
_GPU_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class Selector(msgspec.Struct, frozen=True):
    name: str | None = None
    kind: str | None = None
    ranks: frozenset[int] | None = None
    steps: frozenset[int] | None = None


class Edit(msgspec.Struct, frozen=True):
    action: str  # one of ACTIONS
    selector: Selector
    value: float  # factor (scale, comm-bandwidth) or µs (set-duration)
    text: str  # as the user wrote it, for messages

    @property
    def label(self) -> str:
        return f"--{self.action} {self.text}"


class EditResult(msgspec.Struct, frozen=True):
    edit: Edit
    nodes: int  # nodes whose duration the edit set (changed or not)
    ops: int  # ops (a node with its parts) among them
    before_us: int  # their durations before the edit, summed
    after_us: int
    unfitted: int = 0  # comm-bandwidth: selected nodes with no size, so no fit (divided by the factor)

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


class Transfer(msgspec.Struct, frozen=True):
    """What the bandwidth fit reads of one communication node besides its duration."""

    kind: str  # collective kind (ALL_REDUCE, ...; the number where it names none), or SEND / RECV
    size: int  # bytes (attr comm_size); 0 = not given


class TransferFit(msgspec.Struct, frozen=True):
    """One (process group, collective kind)'s transfers: duration ≈ latency_us + bytes × us_per_byte."""

    latency_us: float
    us_per_byte: float
    samples: int  # transfers with a size
    sizes: int  # distinct sizes among them; 1: latency and bandwidth cannot be told apart (latency taken as 0)

    def duration(self, measured_us: int, size: int, bandwidth: float) -> int:
        """µs of a transfer of `size` bytes that took `measured_us`, on a network `bandwidth` times as fast: only
        its fitted bandwidth part changes."""
        return max(0, round(measured_us - size * self.us_per_byte * (1.0 - 1.0 / bandwidth)))


MAX_FIT_SIZES = 256  # Theil-Sen is quadratic in the distinct sizes: more are thinned to this many, evenly


def read_transfers(rank: RankGraph) -> dict[int, Transfer]:
    """node id -> Transfer of every communication node of the rank's file (`rank.source`)."""
    if not rank.source:
        raise BadInput("--comm-bandwidth", f"rank {rank.rank}: no file to read the transfers' sizes from")
    out: dict[int, Transfer] = {}
    _, nodes = read_nodes(Path(rank.source), _TRANSFER_ATTRS)  # simulate's one reader of node attrs
    for node_id, _, node_type, _, _, _, attrs in nodes:
        if node_type not in COMM_NODE_TYPES:
            continue
        if node_type == pb.COMM_COLL_NODE:
            kind = comm_type_name(_int_attr(attrs, "comm_type", -1, rank, node_id))
        else:
            kind = "SEND" if node_type == pb.COMM_SEND_NODE else "RECV"
        out[node_id] = Transfer(kind, max(0, _int_attr(attrs, "comm_size", 0, rank, node_id)))
    return out


_TRANSFER_ATTRS = frozenset({"comm_type", "comm_size"})


def _int_attr(attrs: Mapping[str, object], name: str, default: int, rank: RankGraph, node_id: int) -> int:
    value = attrs.get(name)  # absent, or an attr with no value set: the default
    return default if value is None else attr_int(value, Path(rank.source or "--comm-bandwidth"), node_id, name)


def fit_transfers(points: Sequence[tuple[int, int]]) -> TransferFit:
    """Fit `(bytes, µs)` transfers (bytes > 0) as latency + bytes × time per byte, robustly: each size's median
    time, then the Theil-Sen line through those (the median slope over pairs of sizes, the median intercept), with
    latency and time per byte >= 0. One size only: latency 0, the median time per byte."""
    by_size: dict[int, list[int]] = {}
    for size, us in points:
        by_size.setdefault(size, []).append(us)
    sizes = sorted(by_size)
    if not sizes:
        raise ValueError("no transfer to fit")
    if len(sizes) > MAX_FIT_SIZES:
        sizes = [sizes[round(i * (len(sizes) - 1) / (MAX_FIT_SIZES - 1))] for i in range(MAX_FIT_SIZES)]
    medians = [(b, float(statistics.median(by_size[b]))) for b in sizes]
    if len(medians) == 1:
        b, m = medians[0]
        return TransferFit(0.0, m / b, len(points), 1)
    slope = statistics.median((m2 - m1) / (b2 - b1) for i, (b1, m1) in enumerate(medians)
                              for b2, m2 in medians[i + 1:])
    latency = statistics.median(m - slope * b for b, m in medians)
    if latency < 0 or slope <= 0:  # a line through the origin instead: all of the time is bandwidth
        latency, slope = 0.0, statistics.median(m / b for b, m in medians)
    return TransferFit(latency, slope, len(points), len(medians))


def fit_groups(ranks: Sequence[RankGraph], transfers: Sequence[Mapping[int, Transfer]]
               ) -> dict[tuple[str, str], TransferFit]:
    """(process group, collective kind) -> the fit of its transfers' current durations over all ranks."""
    points: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for rg, shapes in zip(ranks, transfers, strict=True):
        for nd in rg.nodes:
            t = shapes.get(nd.id)
            if t is not None and t.size > 0 and nd.type in COMM_NODE_TYPES:
                points.setdefault((nd.pg or "", t.kind), []).append((t.size, nd.duration))
    return {key: fit_transfers(pts) for key, pts in sorted(points.items())}


def _bandwidth(rg: RankGraph, group: list[int], factor: float, shapes: Mapping[int, Transfer],
               fits: Mapping[tuple[str, str], TransferFit]) -> tuple[list[int], int]:
    """New durations of one selected op's nodes under `comm-bandwidth FACTOR` (see the module docstring), and how
    many of them had no fit (no size: divided by FACTOR)."""
    out, unfitted = [], 0
    for i in group:
        nd = rg.nodes[i]
        t = shapes.get(nd.id)
        fit = fits.get((nd.pg or "", t.kind)) if t is not None and t.size > 0 else None
        if fit is None or t is None:
            unfitted += 1
            out.append(round(nd.duration / factor))
        else:
            out.append(fit.duration(nd.duration, t.size, factor))
    return out, unfitted


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


def apply(ranks: Sequence[RankGraph], edits: Sequence[Edit],
          transfers: Sequence[Mapping[int, Transfer]] | None = None) -> list[EditResult]:
    """Apply `edits` in order to the nodes' simulated durations, in place. BadInput if an edit selects nothing.
    `transfers` (per rank, as `read_transfers` gives them) are read from the ranks' files when a comm-bandwidth
    edit needs them and none are given."""
    results = []
    for edit in edits:
        nodes = ops = before = after = unfitted = 0
        fits: dict[tuple[str, str], TransferFit] = {}
        if edit.action == "comm-bandwidth":
            if transfers is None:
                transfers = [read_transfers(rg) for rg in ranks]
            fits = fit_groups(ranks, transfers)  # from the durations the previous edits left
        for ri, rg in enumerate(ranks):
            for group in select(rg, edit.selector):
                olds = [rg.nodes[i].duration for i in group]
                if edit.action == "set-duration":
                    news = _spread(round(edit.value), olds)
                elif edit.action == "scale":
                    news = [round(d * edit.value) for d in olds]
                else:  # comm-bandwidth
                    assert transfers is not None
                    news, missed = _bandwidth(rg, group, edit.value, transfers[ri], fits)
                    unfitted += missed
                for i, d in zip(group, news, strict=True):
                    rg.nodes[i].duration = d
                nodes += len(group)
                ops += 1
                before += sum(olds)
                after += sum(news)
        if nodes == 0:
            raise BadInput(edit.label, f"selects no node in {len(ranks)} rank(s)")
        results.append(EditResult(edit, nodes, ops, before, after, unfitted))
    return results


def describe(results: Sequence[EditResult]) -> list[dict[str, object]]:
    """JSON-able summary of applied edits."""
    return [{"edit": r.edit.label, "nodes": r.nodes, "ops": r.ops, "before_us": r.before_us, "after_us": r.after_us,
             "added_us": r.added_us, **({"unfitted_nodes": r.unfitted} if r.edit.action == "comm-bandwidth" else {})}
            for r in results]
