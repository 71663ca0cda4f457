"""The floor: read, gunzip (when gzip) and `orjson.loads` each file given, nothing else.

Run as its own process by bench.run, so that its wall time (interpreter start included) and peak RSS compare
like for like with an `etweave convert` process on the same files. Kept free of etweave and bench imports.
With --stats it prints {"bytes": uncompressed bytes, "events": Kineto traceEvents + host ET nodes} instead: the
harness asks a child for these because a child inherits its parent's RSS as the start of its ru_maxrss, so the
harness itself must never hold a parsed trace.
"""

from __future__ import annotations

import gzip
import sys

import orjson


def main(paths: list[str]) -> int:
    stats = paths[:1] == ["--stats"]
    size = events = 0
    for path in paths[1:] if stats else paths:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        doc = orjson.loads(data)
        if stats:
            size += len(data)
            items = (doc.get("traceEvents") or doc.get("nodes") or []) if isinstance(doc, dict) else doc
            events += len(items) if isinstance(items, list) else 0
        del data, doc  # one file at a time, as a converter that frees its input would
    if stats:
        print(orjson.dumps({"bytes": size, "events": events}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
