"""Bytes of an input file, plain or gzip, with limits against hostile input."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

from etweave.errors import BadInput

# A gzip bomb expands without bound; past this we stop and say so. ETWEAVE_MAX_INPUT_BYTES overrides it for a
# larger real trace (or a smaller machine).
MAX_DECOMPRESSED_BYTES = 32 << 30


def input_limit() -> int:
    value = os.environ.get("ETWEAVE_MAX_INPUT_BYTES", "")
    return int(value) if value.isdecimal() else MAX_DECOMPRESSED_BYTES
_CHUNK = 1 << 22


def read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The file's content, gunzipped when it starts with the gzip magic, whatever its name."""
    limit = input_limit() if limit is None else limit
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head != b"\x1f\x8b":
                if os.fstat(f.fileno()).st_size > limit:
                    raise BadInput(path, f"larger than the {limit} byte limit")
                return f.read()
            return _gunzip(f, path, limit)
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc


def _gunzip(f: object, path: Path, limit: int) -> bytes:
    # Decompress in bounded chunks so a bomb fails at the limit instead of exhausting memory.
    out = bytearray()
    d = zlib.decompressobj(wbits=31)
    try:
        while True:
            chunk = f.read(_CHUNK)  # type: ignore[attr-defined]
            if not chunk:
                break
            while chunk:
                out += d.decompress(chunk, max(1, limit + 1 - len(out)))
                if len(out) > limit:
                    raise BadInput(path, f"decompresses to more than the {limit} byte limit (a gzip bomb?)")
                chunk = d.unconsumed_tail
            if d.eof and d.unused_data:
                # concatenated gzip members: continue with a fresh decompressor
                rest = d.unused_data
                d = zlib.decompressobj(wbits=31)
                out += d.decompress(rest)
        if not d.eof:
            raise BadInput(path, "truncated gzip stream")
    except (zlib.error, gzip.BadGzipFile, EOFError) as exc:
        raise BadInput(path, f"corrupt gzip data: {exc}") from exc
    return bytes(out)
