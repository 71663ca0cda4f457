"""The floor: read, gunzip (when gzip) and `orjson.loads` each file given, nothing else.

Run as its own process by bench.run, so that its wall time (interpreter start included) and peak RSS compare
like for like with an `etweave convert` process on the same files. Kept free of etweave and bench imports.
"""

from __future__ import annotations

import gzip
import sys

import orjson


def main(paths: list[str]) -> int:
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        doc = orjson.loads(data)
        del data, doc  # one file at a time, as a converter that frees its input would
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
