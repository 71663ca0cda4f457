"""Read and write Chakra `.et` streams: GlobalMetadata, then Node after Node, each length-prefixed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from google.protobuf.internal.decoder import _DecodeVarint32  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from google.protobuf.json_format import MessageToDict

from etweave.chakra import et_def_pb2 as pb
from etweave.errors import BadInput
from etweave.output import stage, write_atomic
from etweave.read.source import read_plain

SCHEMA_VERSION = "0.0.4"


def _delimited(msg: pb.GlobalMetadata | pb.Node) -> Iterator[bytes]:
    data = msg.SerializeToString(deterministic=True)  # deterministic: the same input gives the same bytes
    yield _VarintBytes(len(data))
    yield data


def _stream(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> Iterator[bytes]:
    if not metadata.version:
        raise ValueError("GlobalMetadata.version must be set: an empty message reads as end of file")
    yield from _delimited(metadata)
    for node in nodes:
        yield from _delimited(node)


def serialize(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> bytes:
    """The .et stream in memory (a whole-run conversion ships ranks between processes this way)."""
    return b"".join(_stream(metadata, nodes))


def write_et(path: Path, metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> None:
    """Stream to a temporary file beside `path`, renamed only once complete."""
    write_atomic(path, _stream(metadata, nodes))


def stage_et(path: Path, metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node], clean: bool = True) -> Path:
    """Stream to a temporary file beside `path` and return it; `etweave.output.commit` renames it into place."""
    return stage(path, _stream(metadata, nodes), clean)


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


def _messages(data: bytes, path: Path | str) -> Iterator[bytes]:
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
    return parse(read_plain(Path(path)), Path(path))  # a pipe or a device: read_plain decides


def parse(data: bytes, path: Path | str = "<memory>") -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """The inverse of `serialize`: a GlobalMetadata, then the nodes."""
    messages = _messages(data, path)
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
