"""Host ET ops to Kineto cpu events, and the window (µs) of the Kineto events that belongs to the host ET.

Two linkers: by `rf_id` = `Record function id` where both traces carry it, else by aligning each host thread's
op sequence with a Kineto thread (names, order, nesting by start order, and `seq_id` <-> `Sequence number`).
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections import Counter, defaultdict
from itertools import islice

import msgspec

from etweave.read.host_et import HostOp, HostTrace
from etweave.read.kineto import NO_INDEX, EventTable, KinetoTrace

# How far the aligner looks ahead for a resynchronisation point when names disagree.
LOOKAHEAD = 48


class HostLink(msgspec.Struct):
    method: str  # "rf_id", "alignment" or "none"
    event_of: dict[int, int]  # host op id -> index of its Kineto event
    kthread_of: dict[int, int | str]  # host ET tid -> Kineto thread id
    seq_offset: int = 0  # Kineto `Sequence number` minus host `seq_id`: nonzero when the host ET is another step
    window: tuple[float, float] | None = None  # measured span (µs) of the linked Kineto events
    warnings: dict[str, int] = msgspec.field(default_factory=dict)


def cpu_threads(events: EventTable) -> dict[int | str, list[int]]:
    """Kineto cpu events per thread in entry order: start time, then outer before inner."""
    threads: dict[int | str, list[int]] = defaultdict(list)
    tid, ts, ev_idx, dur = events.tid, events.ts, events.ev_idx, events.dur
    for i in events.cpu:
        threads[tid[i]].append(i)
    for idx in threads.values():
        # = idx.sort(key=events.entry_key), in stable passes of one number per event (no tuple per event: at a
        # few million events those were the largest objects of the stage): the tie-breaker, then the start; each
        # pass only when the events are not in its order already (they usually are: the file's order is Kineto's)
        indices = [ev_idx[i] for i in idx]
        if NO_INDEX in indices:
            idx.sort(key=lambda i: x if (x := ev_idx[i]) != NO_INDEX else -dur[i])
        elif indices != sorted(indices):
            idx.sort(key=ev_idx.__getitem__)
        starts = [ts[i] for i in idx]
        if starts != sorted(starts):
            idx.sort(key=ts.__getitem__)
    return dict(threads)


def link_host(host: HostTrace, kineto: KinetoTrace | None) -> HostLink:
    if kineto is None:
        return HostLink("none", {}, {})
    threads = cpu_threads(kineto.events)
    ops = [op for op in host.ops if not op.is_process_root and not op.is_thread_root]
    events = kineto.events
    rf_id = events.rf_id
    has_rf = any(rf_id[i] for idx in threads.values() for i in idx[:1000])
    link = _link_by_rf_id(ops, events) if has_rf else _link_by_alignment(ops, events, threads)
    if link.event_of:
        link.window = _span(events, list(link.event_of.values()))
    return link


def _span(events: EventTable, linked: list[int]) -> tuple[float, float]:
    """First start and last end (µs) of these events."""
    ts, dur = events.ts, events.dur
    return (min([ts[i] for i in linked]), max([ts[i] + dur[i] for i in linked]))


def _link_by_rf_id(ops: list[HostOp], events: EventTable) -> HostLink:
    rf_id, names = events.rf_id, events.name
    by_rf = {rf_id[i]: i for i in events.cpu if rf_id[i]}  # 0 = recorded while the observer was off
    event_of: dict[int, int] = {}
    mismatched = 0
    for op in ops:
        at = by_rf.get(op.rf_id) if op.rf_id else None
        if at is None:
            continue
        if names[at] != op.name:
            mismatched += 1
            continue
        event_of[op.id] = at
    link = HostLink("rf_id", event_of, _thread_map(ops, event_of, events))
    if mismatched:
        link.warnings["rf_id_name_mismatch"] = mismatched
    return link


def _thread_map(ops: list[HostOp], event_of: dict[int, int], events: EventTable) -> dict[int, int | str]:
    """Each host thread's Kineto thread: where most of its linked ops ran (gloo work is on worker threads)."""
    votes: dict[int, Counter[int | str]] = defaultdict(Counter)
    tid = events.tid
    for op in ops:
        i = event_of.get(op.id)
        if i is not None:
            votes[op.et_tid][tid[i]] += 1
    return {tid: c.most_common(1)[0][0] for tid, c in sorted(votes.items())}


def _seq_offset(ops: list[HostOp], events: EventTable, threads: dict[int | str, list[int]]) -> int | None:
    """The offset between host seq ids and Kineto sequence numbers that matches the most (name, seq) pairs.

    0 when the host ET is one of the Kineto iterations; nonzero when it was recorded in another step
    (docs/FACTS.md §M1: dlrm's host ET is the step before its Kineto trace), and then we link to the step that is
    structurally identical. None when neither side has sequence numbers.
    """
    seq, names = events.seq, events.name
    by_name: dict[str, list[int]] = defaultdict(list)  # Kineto sequence numbers per op name
    for i in [i for idx in threads.values() for i in idx if seq[i] >= 0]:
        by_name[names[i]].append(seq[i])
    host_pairs = [(op.name, op.seq_id) for op in ops if op.seq_id >= 0]
    if not host_pairs or not by_name:
        return None
    numbers_of = {name: set(numbers) for name, numbers in by_name.items()}
    nothing: set[int] = set()
    host_numbers = [(numbers_of.get(name, nothing), s) for name, s in host_pairs]
    if all(s in numbers for numbers, s in host_numbers):  # 0 matches every pair: no offset scores more or is smaller
        return 0
    candidates: Counter[int] = Counter()
    for name, s in host_pairs[:64]:  # each Kineto number of the name minus the host's, counted in C
        candidates.update(map((-s).__add__, by_name.get(name, ())))
    if not candidates:
        return None
    # The first 64 pairs bound each candidate's score (at most its count among them plus one per other pair):
    # candidates in decreasing count (the preferred first among equal counts), until none can reach the best
    # score, skipping those whose bound loses even the tie-break; the same choice as scoring them all.
    others = len(host_pairs) - min(64, len(host_pairs))
    best: tuple[int, int, int] | None = None
    for d in sorted(candidates, key=lambda d: (candidates[d], -abs(d), -d), reverse=True):
        bound = candidates[d] + others
        if best is not None and bound < best[0]:
            break
        if best is not None and (bound, -abs(d), -d) < best:
            continue
        key = (sum([s + d in numbers for numbers, s in host_numbers]), -abs(d), -d)
        if best is None or key > best:
            best = key
    assert best is not None  # candidates is not empty
    return -best[2]


def _link_by_alignment(ops: list[HostOp], events: EventTable, threads: dict[int | str, list[int]]) -> HostLink:
    offset = _seq_offset(ops, events, threads)
    per_thread: dict[int, list[HostOp]] = defaultdict(list)
    for op in ops:
        per_thread[op.et_tid].append(op)
    event_of: dict[int, int] = {}
    kthread_of: dict[int, int | str] = {}
    used: set[int | str] = set()
    warnings: Counter[str] = Counter()
    # Threads with sequence numbers anchor first; their span then locates the others.
    order = sorted(per_thread, key=lambda t: (not any(op.seq_id >= 0 for op in per_thread[t]), t))
    span: tuple[float, float] | None = None
    for et_tid in order:
        host_ops = per_thread[et_tid]
        best: tuple[int, int | str, dict[int, int]] | None = None
        for ktid, idx in threads.items():
            if ktid in used:
                continue
            for anchor in _anchors(host_ops, idx, events, offset, span):
                matched = _align(host_ops, idx, events, anchor, offset)
                if best is None or len(matched) > best[0]:
                    best = (len(matched), ktid, matched)
        if best is None or best[0] == 0:
            warnings["host_threads_unlinked"] += 1
            continue
        _, ktid, matched = best
        used.add(ktid)
        kthread_of[et_tid] = ktid
        event_of.update(matched)
        lo, hi = _span(events, list(matched.values()))
        span = (lo, hi) if span is None else (min(span[0], lo), max(span[1], hi))
    link = HostLink("alignment", event_of, kthread_of, seq_offset=offset or 0, warnings=dict(warnings))
    return link


def _anchors(host_ops: list[HostOp], idx: list[int], events: EventTable, offset: int | None,
             span: tuple[float, float] | None) -> list[tuple[int, int]]:
    """Candidate (host position, Kineto position) pairs to start aligning from."""
    names, ts = events.name, events.ts
    if offset is not None:
        seq = events.seq
        for h, op in enumerate(host_ops):
            if op.seq_id < 0:
                continue
            want = op.seq_id + offset
            hit = next((k for k, i in enumerate(idx) if seq[i] == want and names[i] == op.name), None)
            if hit is not None:
                return [(h, hit)]
            break
    if span is not None:  # a thread without sequence numbers: start where the anchored threads' step starts
        k = bisect_left(idx, span[0], key=ts.__getitem__)  # (idx is in start order)
        if k == len(idx):
            return []
        name = host_ops[0].name
        near = [j for j in range(k, min(len(idx), k + 4 * LOOKAHEAD)) if names[idx[j]] == name]
        return [(0, near[0] if near else k)]
    # Nothing to go by: try the first few places where the first op's name occurs (the first full match wins).
    first = host_ops[0].name
    return list(islice(((0, k) for k, i in enumerate(idx) if names[i] == first), 8))


def _align(host_ops: list[HostOp], idx: list[int], events: EventTable, anchor: tuple[int, int],
           offset: int | None) -> dict[int, int]:
    """Greedy two-pointer alignment outward from an anchor, resynchronising on names within LOOKAHEAD."""
    matched: dict[int, int] = {}
    h0, k0 = anchor
    _walk(host_ops, idx, events, h0, k0, 1, offset, matched)
    _walk(host_ops, idx, events, h0 - 1, k0 - 1, -1, offset, matched)
    return matched


def _same(op: HostOp, i: int, events: EventTable, offset: int | None) -> bool:
    """Kineto event i can be host op `op`: the same name and, where both have one, the sequence number."""
    if op.name != events.name[i]:
        return False
    if offset is not None and op.seq_id >= 0:
        s = events.seq[i]
        if s >= 0 and s != op.seq_id + offset:
            return False
    return True


def _walk(host_ops: list[HostOp], idx: list[int], events: EventTable, h: int, k: int, step: int,
          offset: int | None, matched: dict[int, int]) -> None:
    nh, nk = len(host_ops), len(idx)
    while 0 <= h < nh and 0 <= k < nk:
        op = host_ops[h]
        if _same(op, idx[k], events, offset):
            matched[op.id] = idx[k]
            h += step
            k += step
            continue
        skip_k = next((d for d in range(1, LOOKAHEAD) if 0 <= k + step * d < nk
                       and _same(op, idx[k + step * d], events, offset)), None)
        i = idx[k]
        skip_h = next((d for d in range(1, LOOKAHEAD) if 0 <= h + step * d < nh
                       and _same(host_ops[h + step * d], i, events, offset)), None)
        if skip_k is not None and (skip_h is None or skip_k <= skip_h):
            k += step * skip_k
        elif skip_h is not None:
            h += step * skip_h
        else:
            h += step
            k += step


# Evidence that a host ET and a Kineto trace are not of one run and rank. On every pair of the shared traces
# (and every run etweave.collect writes) both files carry the same process id, no rf_id names another op, and the
# linked share is >= 99.8%; on each mismatched pair tried (another model, another rank) the process ids differ.
# A low linked share counts only when the process ids cannot tell: with the same process, the files are of one
# run and rank and a poor link (a damaged host ET) is counted in the report instead.
MIN_LINKED_SHARE = 0.5
MAX_RF_ID_NAME_MISMATCH = 0.1
_PID = operator.attrgetter("pid")


def mismatch_evidence(host: HostTrace, kineto: KinetoTrace, link: HostLink) -> list[str]:
    """Why the two files are not of the same run and rank; [] when nothing says so."""
    evidence: list[str] = []
    counts = Counter(map(_PID, kineto.events.at(kineto.events.cpu[:10000])))  # (counted in C: a few distinct)
    pids = Counter({p: n for p, n in counts.items() if isinstance(p, int) and not isinstance(p, bool)})
    kineto_pid = pids.most_common(1)[0][0] if pids else None
    same_process = bool(host.pid) and kineto_pid == host.pid
    if host.pid and kineto_pid is not None and not same_process:
        evidence.append(f"the host ET is of process {host.pid}, the Kineto cpu ops of process {kineto_pid}")
    ops = sum(1 for op in host.ops if not op.is_process_root and not op.is_thread_root)
    if ops:
        wrong = link.warnings.get("rf_id_name_mismatch", 0)
        if wrong > MAX_RF_ID_NAME_MISMATCH * ops:
            evidence.append(f"the Record function ids of {wrong} host ops name other ops in the Kineto trace")
        linked = len(link.event_of)
        if linked < MIN_LINKED_SHARE * ops and not same_process:
            evidence.append(f"only {linked} of {ops} host ops link to a Kineto cpu op ({linked / ops:.0%})")
    return evidence
