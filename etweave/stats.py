"""Percentiles and percentages: the one home of the rules every summary uses (simulate's metrics and steps,
the convert report's fidelity figures)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (q in 0..100): the smallest value with at least q% of the
    values at or below it. 0.0 for no values."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values) / 100) - 1))
    return sorted_values[k]


def upper_percentile(values: Iterable[float], fraction: float) -> float:
    """The value at position floor(fraction * n) of the sorted values (fraction in 0..1), the last one at most:
    the nearest-rank percentile except where fraction * n is whole, where it is the next value (the median of 4
    values is the 3rd). The rule of the convert report's fidelity figures (`etweave.fidelity`), kept as it is so
    their numbers do not change. 0.0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def percent(part: float, whole: float) -> float | None:
    """`part` in % of `whole`, rounded to 3 decimals; None when `whole` is 0."""
    return round(100.0 * part / whole, 3) if whole else None
