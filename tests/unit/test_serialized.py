"""The audit's serialized-work counts (etweave.serialized): the whole-list passes agree with the plain sweeps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from etweave.serialized import _overlap, _overlapping, _serialized_of


def _of(starts: list[int], ends: list[int]) -> dict[str, int]:
    """`_serialized_of` of spans given by their ends (it takes their lengths)."""
    return _serialized_of(starts, [e - s for s, e in zip(starts, ends, strict=True)])


# spans of integer µs, some empty-free, many touching or sharing a start (the cases the sweep orders)
_SPANS = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 15)), max_size=30)


@settings(deadline=None)  # (no timing in tests: a loaded host must not fail it)
@given(_SPANS, st.integers(0, 1_700_000_000_000_000))
def test_counts_agree_with_the_sweeps(spans: list[tuple[int, int]], base: int) -> None:
    starts = [base + s for s, _ in spans]
    ends = [base + s + d for s, d in spans]
    assert _of(starts, ends) == {"overlap_micros": round(_overlap(starts, ends)),
                                            "nodes": _overlapping(starts, ends)}


def test_touching_spans_do_not_overlap_and_equal_starts_do() -> None:
    assert _of([0, 5], [5, 9]) == {"overlap_micros": 0, "nodes": 0}
    assert _of([3, 3, 20], [10, 4, 21]) == {"overlap_micros": 1, "nodes": 2}
    assert _of([0, 2, 4], [10, 3, 6]) == {"overlap_micros": 3, "nodes": 3}
    assert _of([], []) == {"overlap_micros": 0, "nodes": 0}


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 9)), min_size=1, max_size=30), st.data())
def test_a_chain_of_disjoint_spans_counts_nothing_until_one_overlaps(gaps: list[tuple[int, int]],
                                                                    data: st.DataObject) -> None:
    # one thread's periods: each starts at or after the previous one's end (the shortcut's case)
    starts, ends, t = [], [], 0
    for gap, length in gaps:
        starts.append(t + gap)
        ends.append(t + gap + length)
        t = ends[-1]
    assert _of(starts, ends) == {"overlap_micros": 0, "nodes": 0}
    # a span added over the chain: the full sweeps again, and they agree
    s = data.draw(st.integers(0, t))
    starts.append(s)
    ends.append(s + data.draw(st.integers(1, 9)))
    assert _of(starts, ends) == {"overlap_micros": round(_overlap(starts, ends)),
                                            "nodes": _overlapping(starts, ends)}
