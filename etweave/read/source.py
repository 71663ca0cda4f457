"""Bytes of an input file, plain or gzip, with limits against hostile input."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Any

from etweave.errors import BadInput

# A gzip bomb expands without bound; past this we stop and say so. ETWEAVE_MAX_INPUT_BYTES overrides it for a
# larger real trace (or a smaller machine).
MAX_DECOMPRESSED_BYTES = 32 << 30


def input_limit() -> int:
    value = os.environ.get("ETWEAVE_MAX_INPUT_BYTES", "")
    return int(value) if value.isdecimal() else MAX_DECOMPRESSED_BYTES
_CHUNK = 1 << 22


def read_bytes(path: Path, limit: int | None = None) -> bytes | bytearray:
    """The file's content, gunzipped when it starts with the gzip magic, whatever its name (both JSON parsers
    take either type)."""
    limit = input_limit() if limit is None else limit
    try:
        with open(path, "rb", buffering=0) as f:  # unbuffered: one copy of a large file, not two
            head = f.read(2)
            f.seek(0)
            if head != b"\x1f\x8b":
                if os.fstat(f.fileno()).st_size > limit:
                    raise BadInput(path, f"larger than the {limit} byte limit")
                return f.read()
            return _gunzip(f, path, limit)
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc


def _gunzip(f: Any, path: Path, limit: int) -> bytearray:
    """Decompress in bounded chunks (a bomb fails at the limit instead of exhausting memory) into a buffer sized
    from the gzip trailer, so a large trace is held once, not copied on every growth or at the end."""
    size = os.fstat(f.fileno()).st_size
    if size < 18:  # header and trailer alone take 18 bytes
        raise BadInput(path, "truncated gzip stream")
    f.seek(-4, os.SEEK_END)
    expected = int.from_bytes(f.read(4), "little")  # ISIZE: the size mod 2**32; only a first guess
    f.seek(0)
    # deflate expands at most ~1032:1, so a lying trailer cannot make us allocate more than that
    out = bytearray(min(expected, limit + 1, size * 1032))
    pos = 0

    def put(data: bytes) -> None:
        nonlocal pos
        end = pos + len(data)
        if end <= len(out):
            out[pos:end] = data
        else:  # the guess was short (over 4 GiB, or several members): grow
            out[pos:] = data
        pos = end
        if pos > limit:
            raise BadInput(path, f"decompresses to more than the {limit} byte limit (a gzip bomb?)")

    d = zlib.decompressobj(wbits=31)
    try:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            while chunk:
                put(d.decompress(chunk, _CHUNK))
                chunk = d.unconsumed_tail
            if d.eof and d.unused_data:
                # concatenated gzip members: continue with a fresh decompressor
                rest = d.unused_data
                d = zlib.decompressobj(wbits=31)
                put(d.decompress(rest))
        if not d.eof:
            raise BadInput(path, "truncated gzip stream")
    except (zlib.error, gzip.BadGzipFile, EOFError) as exc:
        raise BadInput(path, f"corrupt gzip data: {exc}") from exc
    del out[pos:]
    return out
