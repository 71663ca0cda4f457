"""`etweave jsonize FILE.et`: a Chakra trace as JSON, in etweave's shape or Chakra's `chakra_jsonizer` shape.

Streamed node by node, so memory does not grow with the file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import orjson

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import chakra_json, iter_et, message_dict
from etweave.output import FileBytes, check_outputs, write_together
from etweave.progress import counted

FORMATS = """\
Formats:
  etweave (default): one JSON object {"metadata": {...}, "nodes": [{...}, ...]}, protobuf field names
    (snake_case), every field printed, also those at their default (0, "", []).
  chakra: what Chakra's chakra_jsonizer writes, byte for byte: one JSON object per message (GlobalMetadata
    first, then each Node), each protobuf's JSON mapping (google.protobuf.json_format.MessageToJson: camelCase
    names, fields at their default left out, 64-bit integers as strings, indent 2), written one after the
    other with nothing between them (read them with json.JSONDecoder.raw_decode).
Input: a .et file, plain or gzip-compressed (.et.gz)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("jsonize", help="print a Chakra .et file as JSON",
                       description="Print a Chakra .et (or .et.gz) file as JSON, streamed node by node.",
                       epilog=FORMATS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path, help="a .et or .et.gz file")
    p.add_argument("--format", choices=tuple(JSON_FORMATS), default="etweave",
                   help="etweave's document (default) or Chakra's chakra_jsonizer output (see below)")
    p.add_argument("-o", "--output", type=Path, metavar="FILE",
                   help="write here (atomically: nothing on failure) instead of standard output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        check_outputs([("-o", args.output)], [args.trace])  # never the input itself
    metadata, nodes = iter_et(args.trace)
    nodes = counted(nodes, f"jsonizing {args.trace.name}", unit="nodes")
    chunks = JSON_FORMATS[args.format](metadata, nodes)
    if args.output is not None:
        write_together([FileBytes(args.output, chunks)])
    else:
        out = sys.stdout.buffer
        for chunk in chunks:
            out.write(chunk)
        out.flush()
    return 0


def chakra_chunks(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> Iterator[bytes]:
    yield chakra_json(metadata).encode()
    for node in nodes:
        yield chakra_json(node).encode()


def _indented(obj: object, depth: int) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2).replace(b"\n", b"\n" + b" " * depth)


def etweave_chunks(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> Iterator[bytes]:
    """The same bytes as dumping the whole document with orjson's indent 2, one node at a time."""
    yield b'{\n  "metadata": ' + _indented(message_dict(metadata), 2) + b',\n  "nodes": ['
    sep = b"\n    "
    for node in nodes:
        yield sep + _indented(message_dict(node), 4)
        sep = b",\n    "
    yield b"]\n}\n" if sep == b"\n    " else b"\n  ]\n}\n"


# --format name -> the renderer of that JSON shape, streamed
JSON_FORMATS: Mapping[str, Callable[[pb.GlobalMetadata, Iterable[pb.Node]], Iterator[bytes]]] = {
    "etweave": etweave_chunks, "chakra": chakra_chunks}
