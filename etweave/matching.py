"""Which comm nodes of different ranks are one operation: the one rule that `convert-run`'s cross-rank check,
`etweave check` and `etweave simulate`'s replay all apply (docs/FACTS.md §E5, §A5, §A6; `etweave simulate --help`).

- Collectives: the members of a process group are the ranks its comm-group entry lists ("" = every rank), taken
  among the ranks at hand, in ascending rank. On each member, a group's collectives are taken in issue order
  (ascending node id); the k-th of each member is one instance.
- Send/recv: a channel is (src, dst, tag). The k-th send on a channel (ascending node id) matches the k-th recv on
  it. A channel with an end outside the ranks at hand cannot be matched.

Pure functions over caller-chosen items, so each caller keeps its own per-node payload (a node index, a signature,
an id with a size) and its own messages. Sequences come in issue order; `issue_order` sorts a rank's items into it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Generic, TypeVar

import msgspec

# (src rank, dst rank, tag) of a send or recv
Channel = tuple[int, int, int]

T = TypeVar("T")
# An item that sorts into issue order: a tuple of ints whose first is the node id (the caller's payload follows;
# it breaks ties between nodes of different files that share an id, as `etweave check` meets them on a
# mislabelled send).
IdFirst = TypeVar("IdFirst", bound=tuple[int, ...])


def issue_order(items: Iterable[IdFirst]) -> list[IdFirst]:
    """`items` (node id first) in the order the simulator issues ready nodes: ascending id."""
    return sorted(items)


def group_members(pg: str, present: Iterable[int], comm_group: Mapping[str, Iterable[int]] | None) -> list[int] | None:
    """The members of group `pg` among the ranks `present`, ascending; "" is every rank present. None when the
    comm-group map does not list `pg` (its members are unknown)."""
    if pg == "":
        return sorted(present)
    if comm_group is None or pg not in comm_group:
        return None
    # the group's ranks looked up in `present`, not `present` copied: a run's groups cost the sum of their sizes,
    # not groups x ranks (256 groups of 4 in 1024 ranks)
    here = present if isinstance(present, AbstractSet | Mapping) else set(present)
    return sorted({r for r in map(int, comm_group[pg]) if r in here})


def collective_instances(sequences: Mapping[int, Sequence[T]], members: Sequence[int]) -> Iterator[list[T | None]]:
    """One group's collective instances, k = 0, 1, ...: the k-th item of each member's sequence (issue order),
    aligned with `members`; None where a member's sequence has ended (or it has none). As many instances as the
    longest member sequence."""
    seqs = [sequences.get(r, ()) for r in members]
    longest = max((len(s) for s in seqs), default=0)
    for k in range(longest):
        yield [s[k] if k < len(s) else None for s in seqs]


class ChannelMatch(msgspec.Struct, Generic[T], frozen=True):
    """The sends and recvs of one channel, each in issue order; the k-th send and the k-th recv are one message."""

    channel: Channel
    sends: list[T]
    recvs: list[T]
    matchable: bool  # both ends are among the ranks at hand (otherwise nothing on the channel is matched)

    @property
    def pairs(self) -> Iterator[tuple[T, T]]:
        """(send, recv) of each message, in issue order."""
        return zip(self.sends, self.recvs, strict=False)

    @property
    def unmatched_sends(self) -> list[T]:
        return self.sends[len(self.recvs):]

    @property
    def unmatched_recvs(self) -> list[T]:
        return self.recvs[len(self.sends):]


def match_p2p(sends: Mapping[Channel, Iterable[IdFirst]], recvs: Mapping[Channel, Iterable[IdFirst]],
              present: Collection[int]) -> Iterator[ChannelMatch[IdFirst]]:
    """Every channel that has a send or a recv, in ascending (src, dst, tag), with its sends and recvs put in
    issue order (items are node id first)."""
    for channel in sorted(sends.keys() | recvs.keys()):
        src, dst, _tag = channel
        yield ChannelMatch(channel, issue_order(sends.get(channel, ())), issue_order(recvs.get(channel, ())),
                           src in present and dst in present)
