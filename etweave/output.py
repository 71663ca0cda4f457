"""Writing outputs atomically: to a temporary file beside the target, renamed only once complete, so a failed
run never leaves a half-written file."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from etweave.errors import BadInput


def write_atomic(path: Path, chunks: Iterable[bytes] | bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb", buffering=1 << 20) as out:
            if isinstance(chunks, bytes):
                out.write(chunks)
            else:
                for chunk in chunks:
                    out.write(chunk)
        os.replace(tmp, path)
    except OSError as exc:
        raise BadInput(path, f"cannot write: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj: Any) -> None:
    """Indented, keys sorted: the same report gives the same bytes."""
    write_atomic(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
