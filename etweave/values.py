"""How the traces write values, decoded the same way by the readers (`read/`) and by the stage that builds items
(`assemble`): ids that are numbers in one PyTorch version and strings in another, tensors inside an op's inputs and
outputs. A leaf module: it imports nothing of etweave but the width limits (`read/widths.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from etweave.read.widths import INT64_MAX, INT64_MIN  # the range of an id read as a plain int


def as_int(value: Any, default: int | None = None) -> int | None:
    """Kineto writes some ids as numbers in one version and strings in another."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if INT64_MIN <= value <= INT64_MAX else default  # nothing real is that large: a corrupt field
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    if isinstance(value, float) and value.is_integer() and INT64_MIN <= value <= INT64_MAX:
        return int(value)
    return default


def tensors(values: list[Any], types: list[Any]) -> Iterator[tuple[int, int, int, int, int]]:
    """(position, tensor_id, storage_id, num_elem, elem_bytes) of every tensor among an op's inputs or outputs."""
    for pos, (value, typ) in enumerate(zip(values, types, strict=False)):
        if not isinstance(typ, str) or "Tensor" not in typ:
            continue
        for t in _flatten_tensors(value):
            yield pos, t[0], t[1], t[3], t[4]


def _flatten_tensors(value: Any) -> Iterator[list[Any]]:
    if isinstance(value, list):
        if len(value) == 6 and all(isinstance(x, int) and not isinstance(x, bool) for x in value[:5]):
            yield value
        else:
            for v in value:
                yield from _flatten_tensors(v)
