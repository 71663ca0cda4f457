"""Replaying the ranks one after another, not in one global time order: both replays' event loops use this.

Ranks meet only where a collective starts (its last member issued it) and where a recv gets its message. So a
rank can replay on its own up to its *horizon*: the earliest time one of its issued comm nodes that another rank
decides (its *pending* nodes) could end. The ranks replay in turn, each up to its horizon; when a rank decides
another's pending node, that rank's horizon rises and it is queued again. When no rank can go on (each waits for
another), the earliest event not replayed yet bounds when any rank issues next: the horizons rise by it (`gvt`,
the global virtual time of conservative parallel simulation), and if still none can go on, the rank with the
earliest event replays that time alone, as the global order would.

Why: in one global order the loop touches every rank's nodes between two events of one rank. At 1000 ranks those
no longer fit in the caches, and the same work per node took about twice its time at 64 ranks (a heap of every
rank's events was deeper too). Rank by rank, a rank's nodes stay in the caches for a stretch of its run, and each
heap holds one rank's events.

Where a rank's own order cannot tell what the global order does (the loop raises `Ambiguous`), or the ranks keep
waiting on each other (more than MAX_STALLS stalls and one per node of the average rank: a stall's work grows with
the ranks, so this keeps all stalls within about one pass over the nodes), the loop starts again in one global order:
one heap shared by every rank, no horizon. Both orders give the same result; the tests hold each replay to it.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush, heapreplace

FAR = 1 << 1024  # a horizon above every key
MAX_STALLS = 64


class Ambiguous(Exception):  # a signal to start again in one global order, never shown
    """The rank-by-rank order cannot tell what the global order does here."""


class RankByRank:
    """The bookkeeping of a replay rank by rank, for an event loop whose heap keys hold the time above bit
    `time_shift`. A subclass replays rank `ri`'s events below `horizon[ri]` (`_replay`), says the earliest a
    pending node could end (`_earliest_end`) and calls `wait_elsewhere` / `decided` where its comm nodes wait for
    and get another rank's decision. With `by_rank` off (or one rank), every rank's heap is one shared list and
    every horizon FAR: `_replay(0)` replays the whole run in the global order."""

    time_shift: int
    tie_shift: int | None = None  # keys equal above this bit, on two ranks: their global order is not known

    def _init_ranks(self, nranks: int, nnodes: int, by_rank: bool) -> None:
        self.by_rank = by_rank and nranks > 1
        self.max_stalls = MAX_STALLS + nnodes // max(nranks, 1)
        shared: list[int] = []
        self.heaps: list[list[int]] = [[] for _ in range(nranks)] if self.by_rank else [shared] * nranks
        self.horizon = [FAR] * nranks  # per rank: the key its replayed events stay below
        self.pending: list[set[int]] = [set() for _ in range(nranks)]  # per rank: comm nodes another rank ends
        # per rank: (earliest end, g) of its pending nodes as last computed, a heap; an earliest end only rises
        # (`_earliest_end`), so each entry is a lower bound and the fresh one on top is the least: a rank can have
        # thousands pending (async collectives), which a scan at every decision made quadratic
        self.pending_ends: list[list[tuple[int, int]]] = [[] for _ in range(nranks)]
        self.runnable: deque[int] = deque()
        self.in_runnable = [False] * nranks
        self.cur = 0  # the rank being replayed
        self.gvt = 0  # every event not replayed yet is at or after this time
        self.stalls = 0

    def _replay(self, ri: int) -> None:
        raise NotImplementedError

    def _earliest_end(self, g: int) -> int:
        raise NotImplementedError

    def replay_all(self) -> None:
        """Every event: in the global order, or rank by rank (each up to its horizon, in turn; `_stall` when
        none can go on)."""
        if not self.by_rank:
            self._replay(0)
            return
        runnable, queued, heaps, horizon = self.runnable, self.in_runnable, self.heaps, self.horizon
        for ri, events in enumerate(heaps):
            if events and events[0] < horizon[ri]:
                runnable.append(ri)
                queued[ri] = True
        while True:
            while runnable:
                ri = runnable.popleft()
                queued[ri] = False
                self.cur = ri
                self._replay(ri)
            if not self._stall():
                return

    def _stall(self) -> bool:
        """No rank can replay below its horizon: raise the horizons by the earliest event not replayed yet; if
        still none can go on, the rank with the earliest event replays that time. False when no event is left."""
        heaps, shift = self.heaps, self.time_shift
        heads = [events[0] for events in heaps if events]
        if not heads:
            return False
        self.stalls += 1
        if self.stalls > self.max_stalls:
            raise Ambiguous
        self.gvt = max(self.gvt, min(heads) >> shift)
        for ri, pending in enumerate(self.pending):
            if pending:
                self.horizon[ri] = self.horizon_of(ri)
        ready = [ri for ri, events in enumerate(heaps) if events and events[0] < self.horizon[ri]]
        if ready:
            self.runnable.extend(ready)
            for ri in ready:
                self.in_runnable[ri] = True
            return True
        first, ri = min((events[0], ri) for ri, events in enumerate(heaps) if events)
        if self.tie_shift is not None and sum(events[0] >> self.tie_shift == first >> self.tie_shift
                                              for events in heaps if events) > 1:
            raise Ambiguous
        self.horizon[ri] = (self.gvt + 1) << shift  # its events at that time
        self.cur = ri
        self._replay(ri)
        self.horizon[ri] = self.horizon_of(ri)
        return True

    def horizon_of(self, ri: int) -> int:
        """The key rank `ri`'s replayed events stay below: the earliest its pending nodes could end."""
        pending, ends = self.pending[ri], self.pending_ends[ri]
        if not pending:
            ends.clear()
            return FAR
        while True:
            was, g = ends[0]
            if g not in pending:  # decided since: its entry goes
                heappop(ends)
                continue
            now = self._earliest_end(g)
            if now == was:
                return now << self.time_shift
            heapreplace(ends, (now, g))

    def wait_elsewhere(self, g: int) -> None:
        """Comm node g, just issued by the rank being replayed, ends when another rank decides."""
        if self.by_rank:
            ri = self.cur
            self.pending[ri].add(g)
            end = self._earliest_end(g)
            heappush(self.pending_ends[ri], (end, g))
            self.horizon[ri] = min(self.horizon[ri], end << self.time_shift)

    def recv_decided_here(self, recv_rank: int, other_rank: int, t_now: int, t_other: int) -> bool:
        """A recv and its send, both issued now: the one just issued at t_now by the rank being replayed, the
        other at t_other on `other_rank`. The global order decides the recv's end when the later of the two
        issues; that is here and now if the recv is this rank's, this rank issued the later one, and the other
        issued strictly before (or on this rank). Else the loop checks the end's place (`Ambiguous`)."""
        return recv_rank == self.cur and t_now >= t_other and (t_other < t_now or other_rank == recv_rank)

    def decided(self, q: int, g: int) -> None:
        """Rank q's node g got its end (its event is in q's heap): q replays on to its new horizon."""
        pending = self.pending[q]
        if g in pending:
            pending.discard(g)
            self.horizon[q] = self.horizon_of(q)
        if q != self.cur and not self.in_runnable[q] and self.heaps[q][0] < self.horizon[q]:
            self.runnable.append(q)
            self.in_runnable[q] = True
