"""A Kineto trace without a host ET: its cpu ops (`cpu_op` and `user_annotation` events) stand in for host ops.

`kineto_host` builds a synthetic `HostTrace` from the cpu ops in a window (a process root, one thread root per
Kineto thread, ops with fresh ids in entry order, parents by time containment on their thread) and the `HostLink`
that links each op to its own event, so the rest of the pipeline runs unchanged. `Selection` is the
`--steps` / `--window` choice of that window.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from etweave.errors import BadInput
from etweave.link import HostLink
from etweave.read.host_et import IO, PROCESS_ROOT_NAMES, THREAD_ROOT_NAMES, HostOp, HostTrace
from etweave.read.kineto import Event, KinetoTrace, as_int

SCHEMA = "kineto-synthesized"
# Kineto rounds to the µs on old traces: a child may seem to end a hair after its parent (as in assemble).
_EPS = 1e-3
_STEP = re.compile(r"ProfilerStep#(\d+)$")

Window = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Selection:
    """Which part of a Kineto trace to convert: `ProfilerStep#A` to `#B` inclusive, or a time window (µs)."""

    steps: tuple[int, int] | None = None
    window: Window | None = None  # an open side is +-inf

    @classmethod
    def parse(cls, steps: str | None = None, window: str | None = None) -> Selection | None:
        """From the CLI strings `A:B` (or `A`) and `START:END` (either side may be empty); None selects all."""
        if steps is not None and window is not None:
            raise BadInput("--steps", "give --steps or --window, not both")
        if steps is not None:
            a, sep, b = steps.partition(":")
            if not a.strip().isdecimal() or (sep and not b.strip().isdecimal()):
                raise BadInput("--steps", f"expected A:B with step numbers A <= B, got {steps!r}")
            first, last = int(a), int(b) if sep else int(a)
            if first > last:
                raise BadInput("--steps", f"first step {first} is after last step {last}")
            return cls(steps=(first, last))
        if window is not None:
            lo_s, sep, hi_s = window.partition(":")
            if not sep:
                raise BadInput("--window", f"expected START:END in µs (Kineto clock), got {window!r}")
            lo, hi = _bound(lo_s, -math.inf, window), _bound(hi_s, math.inf, window)
            if lo > hi:
                raise BadInput("--window", f"START {lo} is after END {hi}")
            return cls(window=(lo, hi))
        return None

    def resolve(self, kineto: KinetoTrace) -> Window:
        """The window in µs on the trace's clock; BadInput when the steps are not there or nothing is selected."""
        if self.steps is not None:
            spans: dict[int, Window] = {}
            for i in kineto.events.cpu:
                ev = kineto.events[i]
                m = _STEP.match(ev.name)
                if m:
                    n = int(m.group(1))
                    lo, hi = spans.get(n, (ev.ts, ev.ts + ev.dur))
                    spans[n] = (min(lo, ev.ts), max(hi, ev.ts + ev.dur))
            first, last = self.steps
            missing = [n for n in (first, last) if n not in spans]
            if missing:
                have = f"steps {min(spans)}..{max(spans)}" if spans else "no ProfilerStep# annotations"
                raise BadInput("--steps", f"ProfilerStep#{missing[0]} is not in the trace ({have})")
            return (spans[first][0], max(hi for n, (_, hi) in spans.items() if first <= n <= last))
        assert self.window is not None
        lo, hi = self.window
        events = kineto.events
        if not any(lo <= events.ts[i] <= hi for idx in (events.cpu, events.runtime, events.gpu) for i in idx):
            raise BadInput("--window", f"selects no cpu op, runtime call or GPU event ({lo}:{hi})")
        return self.window




def _bound(text: str, default: float, whole: str) -> float:
    if not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadInput("--window", f"expected START:END in µs (Kineto clock), got {whole!r}") from None
    if not math.isfinite(value):
        raise BadInput("--window", f"bounds must be finite numbers, got {whole!r}")
    return value


def restrict(linked: Window | None, selected: Window) -> Window:
    """With a host ET: the device window is the linked window cut to the selection."""
    if linked is None:
        return selected
    lo, hi = max(linked[0], selected[0]), min(linked[1], selected[1])
    if lo > hi:
        raise BadInput("--window", f"the selection does not overlap the window the host ET linked to "
                       f"({linked[0]}:{linked[1]})")
    return (lo, hi)


def kineto_host(kineto: KinetoTrace, window: Window | None = None) -> tuple[HostTrace, HostLink]:
    """The synthetic host trace of the cpu ops that start in `window` (all when None) and its link."""
    events = kineto.events
    threads: dict[int | str, list[int]] = {}
    lo, hi = window if window is not None else (-math.inf, math.inf)
    for i in events.cpu:
        if lo <= events.ts[i] <= hi:  # a cpu op belongs to the window when it starts in it
            threads.setdefault(events.tid[i], []).append(i)
    # ET thread ids are ints: a Kineto tid that is not one gets a number above every int tid.
    tids = sorted(threads, key=lambda t: (not isinstance(t, int), str(t)))
    spare = max((t for t in tids if isinstance(t, int)), default=0) + 1
    et_tid = {t: (t if isinstance(t, int) else spare + n) for n, t in enumerate(tids)}
    no = {t: n for n, t in enumerate(tids)}
    empty = IO([], [], [])
    root_id = 1
    ops = [_op(root_id, PROCESS_ROOT_NAMES[0], root_id, 0, empty)]
    thread_root = {t: root_id + 1 + n for n, t in enumerate(tids)}
    ops += [_op(thread_root[t], THREAD_ROOT_NAMES[0], root_id, et_tid[t], empty) for t in tids]
    # Fresh ids in entry order, as the host ET's counter hands them out at op entry: start time across threads,
    # and within a thread Kineto's entry order (outer before inner at equal starts).
    order = sorted(((t, i) for t, idx in threads.items() for i in idx),
                   key=lambda ti: (events.ts[ti[1]], no[ti[0]], events.entry_key(ti[1])))
    id_of = {i: thread_root[tids[-1]] + 1 + n for n, (_, i) in enumerate(order)} if tids else {}
    parent_of, partial = _parents(events, threads, id_of, thread_root)
    for t, i in order:
        ev = events[i]
        args = ev.args
        io = IO([], _list(args.input_dims), _list(args.input_type))
        op = _op(id_of[i], ev.name, parent_of[i], et_tid[t], io)
        op.rf_id = as_int(args.rf_id, 0) or 0
        seq = as_int(args.seq_number, -1)
        op.seq_id = seq if seq is not None else -1
        ops.append(op)
    pid = events[order[0][1]].pid if order else 0
    # path "": there is no host ET file (the output's `source_host` stays empty)
    host = HostTrace(path="", schema=SCHEMA, pid=pid if isinstance(pid, int) else 0, ops=ops)
    if partial:
        host.warnings["kineto_cpu_ops_partly_overlapping"] = partial
    link = HostLink("kineto", {id_of[i]: i for _, i in order}, {et_tid[t]: t for t in tids}, window=window)
    return host, link


def add_unlinked_cpu_ops(host: HostTrace, kineto: KinetoTrace, link: HostLink) -> None:
    """Kineto cpu ops in the linked window that no host ET node stands for (recorded while the observer was
    off, or on a thread it did not see) become ops too, with fresh ids above the host's: nothing is lost.

    Each one's parent is the innermost op containing it on its Kineto thread (a host op where that one is
    linked), else its thread's root; its ET tid is the host thread linked to that Kineto thread, else the
    Kineto tid itself."""
    if link.window is None:
        return
    events = kineto.events
    linked = {i: op_id for op_id, i in link.event_of.items()}
    threads: dict[int | str, list[int]] = {}
    lo, hi = link.window
    for i in events.cpu:
        if lo <= events.ts[i] <= hi:  # a cpu op belongs to the window when it starts in it
            threads.setdefault(events.tid[i], []).append(i)
    new = sorted((i for idx in threads.values() for i in idx if i not in linked),
                 key=lambda i: (events.ts[i], events.entry_key(i)))
    if not new:
        return
    et_of = {ktid: et for et, ktid in link.kthread_of.items()}
    roots = {op.et_tid: op.id for op in host.ops if op.is_thread_root}
    process_root = next((op.id for op in host.ops if op.is_process_root), 0)
    next_id = host.ops[-1].id + 1 if host.ops else 1
    id_of = dict(linked)
    for n, i in enumerate(new):
        id_of[i] = next_id + n
    fallback = {t: roots.get(et_of[t], process_root) if t in et_of else process_root for t in threads}
    parent_of, _ = _parents(events, threads, id_of, fallback)
    for i in new:
        ev = events[i]
        tid = et_of.get(ev.tid, ev.tid if isinstance(ev.tid, int) else 0)
        op = _op(id_of[i], ev.name, parent_of[i], tid, IO([], _list(ev.args.input_dims), _list(ev.args.input_type)))
        op.rf_id = as_int(ev.args.rf_id, 0) or 0
        seq = as_int(ev.args.seq_number, -1)
        op.seq_id = seq if seq is not None else -1
        host.ops.append(op)
        link.event_of[op.id] = i
    host.from_kineto = len(new)


def _parents(events: list[Event], threads: dict[int | str, list[int]], id_of: dict[int, int],
             thread_root: dict[int | str, int]) -> tuple[dict[int, int], int]:
    """Each op's parent id: the innermost op on its thread whose time contains it, else the thread root."""
    parent_of: dict[int, int] = {}
    partial = 0
    for t, idx in threads.items():
        stack: list[int] = []
        for i in sorted(idx, key=events.entry_key):
            ev = events[i]
            end = ev.ts + ev.dur
            # Epoch-µs floats near 1.7e15 hold only quarter µs: allow a couple of units in the last place.
            tol = max(_EPS, 2 * math.ulp(end))
            while stack and events[stack[-1]].ts + events[stack[-1]].dur <= ev.ts + _EPS:
                stack.pop()
            # An op that starts inside another but ends after it (unbalanced annotations) is not contained: its
            # parent is the innermost op that does contain it.
            k = len(stack) - 1
            while k >= 0 and events[stack[k]].ts + events[stack[k]].dur < end - tol:
                k -= 1
            if k != len(stack) - 1:
                partial += 1
            parent_of[i] = id_of[stack[k]] if k >= 0 else thread_root[t]
            stack.append(i)
    return parent_of, partial


def _op(op_id: int, name: str, parent: int, tid: int, inputs: IO) -> HostOp:
    return HostOp(id=op_id, name=name, parent=parent, et_tid=tid, rf_id=0, seq_id=-1, fw_parent=0, fw_tid=0,
                  scope=0, op_schema="", inputs=inputs, outputs=IO([], [], []))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
