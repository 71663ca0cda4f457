"""Read and write Chakra `.et` streams: GlobalMetadata, then Node after Node, each length-prefixed."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from google.protobuf.internal.decoder import _DecodeVarint32  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from google.protobuf.json_format import MessageToDict

from etweave.chakra import et_def_pb2 as pb
from etweave.errors import BadInput

SCHEMA_VERSION = "0.0.4"


def _write_delimited(out: BinaryIO, message: object) -> None:
    data = message.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    out.write(_VarintBytes(len(data)))
    out.write(data)


def write_et(path: Path, metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> None:
    """Write atomically: a temporary file beside `path`, renamed only once complete."""
    if not metadata.version:
        raise ValueError("GlobalMetadata.version must be set: an empty message reads as end of file")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb", buffering=1 << 20) as out:
            _write_delimited(out, metadata)
            for node in nodes:
                _write_delimited(out, node)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def et_files(paths: Iterable[Path]) -> list[Path]:
    """The .et files named: a file as it is, a folder as every `*.et` in it (sorted)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.glob("*.et") if p.is_file())
            if not found:
                raise BadInput(path, "no .et files in this folder")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise BadInput(path, "no such file or folder")
    return files


def _messages(data: bytes, path: Path) -> Iterator[bytes]:
    pos, end = 0, len(data)
    while pos < end:
        try:
            size, pos = _DecodeVarint32(data, pos)
        except Exception as exc:  # the decoder raises IndexError or its own DecodeError
            raise BadInput(path, f"truncated length prefix at byte {pos}") from exc
        if pos + size > end:
            raise BadInput(path, f"truncated message at byte {pos}: needs {size} bytes, {end - pos} left")
        yield data[pos : pos + size]
        pos += size


def read_et(path: Path) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """Read a whole `.et` file (metadata and nodes)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror}") from exc
    messages = _messages(data, Path(path))
    metadata = pb.GlobalMetadata()
    nodes: list[pb.Node] = []
    try:
        first = next(messages, None)
        if first is None:
            raise BadInput(path, "empty file: no GlobalMetadata")
        metadata.ParseFromString(first)
        for raw in messages:
            node = pb.Node()
            node.ParseFromString(raw)
            nodes.append(node)
    except BadInput:
        raise
    except Exception as exc:  # protobuf's DecodeError
        raise BadInput(path, f"not a Chakra .et stream: {exc}") from exc
    return metadata, nodes


def attr_value(attr: pb.AttributeProto) -> object:
    """The Python value of an attribute, whichever oneof it uses."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    return list(value.values) if kind.endswith("_list") else value


def node_attrs(node: pb.Node) -> dict[str, object]:
    return {a.name: attr_value(a) for a in node.attr}


def to_json(metadata: pb.GlobalMetadata, nodes: list[pb.Node]) -> dict[str, object]:
    """A JSON-able view of a trace, as `etweave jsonize` prints it."""
    def as_dict(msg: object) -> dict[str, object]:
        return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)  # type: ignore[arg-type]
    return {"metadata": as_dict(metadata), "nodes": [as_dict(n) for n in nodes]}
