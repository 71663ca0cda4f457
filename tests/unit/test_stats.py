"""Percentiles and percentages (etweave.stats): the two percentile rules and where they part."""

from __future__ import annotations

from etweave.stats import percent, percentile, upper_percentile


def test_nearest_rank_percentile() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.0  # at least half the values at or below it
    assert percentile(values, 95) == 4.0
    assert percentile(values, 0) == 1.0
    assert percentile([], 50) == 0.0


def test_upper_percentile_takes_the_next_value_where_the_rank_is_whole() -> None:
    assert upper_percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 3.0  # unsorted input; 0.5 * 4 is whole
    assert upper_percentile([1.0, 2.0, 3.0], 0.5) == 2.0  # 1.5: the same as nearest rank
    assert upper_percentile([1.0, 2.0], 1.0) == 2.0  # clamped to the last value
    assert upper_percentile([], 0.95) == 0.0


def test_percent_rounds_and_refuses_a_zero_whole() -> None:
    assert percent(1, 3) == 33.333
    assert percent(-5, 20) == -25.0
    assert percent(5, 0) is None
