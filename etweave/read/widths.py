"""What the output can hold: every number that reaches a protobuf field is checked against its width here, when
the input is read, so a value out of range is bad input naming the file and the field, not an error deep in the
writer. One home for these limits."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from etweave.errors import BadInput

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
# Ranks: far above any real run (many thousands of ranks), far below what would make a per-rank list a memory
# problem (a world_size of 1e8 must not make convert-run build a 100-million-entry list).
MAX_RANKS = 1 << 20
# Kineto times (µs, float): start and end must round to an int64 µs; real traces are ~1.7e15 (µs since 1970).
MAX_TIME_MICROS = float(1 << 62)
# Host inputs are nested lists; orjson writes at most 255 levels (the .et IOInfo is JSON; the reader wraps the
# three lists in one more), so deeper is refused when read.
MAX_NESTING = 254


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int64(path: Path | str, field: str, value: int) -> int:
    """`value` (an int) when it fits a signed 64-bit field, else bad input naming the field."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise BadInput(path, f"{field} {_short(value)} out of range (must fit a signed 64-bit integer)")
    return value


def rank(path: Path | str, field: str, value: Any) -> int:
    """A rank: an integer in [0, MAX_RANKS)."""
    if not is_int(value) or not 0 <= value < MAX_RANKS:
        raise BadInput(path, f"{field} {_short(value)} is not a rank (an integer from 0 to {MAX_RANKS - 1})")
    return int(value)


def world_size(path: Path | str, field: str, value: Any) -> int:
    if not is_int(value) or not 1 <= value <= MAX_RANKS:
        raise BadInput(path, f"{field} {_short(value)} is not a world size (an integer from 1 to {MAX_RANKS})")
    return int(value)


def time_ok(value: float) -> bool:
    return -MAX_TIME_MICROS < value < MAX_TIME_MICROS


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
