"""`etweave jsonize FILE.et`: print a Chakra trace as JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from etweave.chakra.io import read_et, to_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("jsonize", help="print a Chakra .et file as JSON")
    p.add_argument("trace", type=Path, help="a .et file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    metadata, nodes = read_et(args.trace)
    sys.stdout.buffer.write(orjson.dumps(to_json(metadata, nodes), option=orjson.OPT_INDENT_2))
    sys.stdout.buffer.write(b"\n")
    return 0
