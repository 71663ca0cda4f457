"""Read and write Chakra `.et` streams: GlobalMetadata, then Node after Node, each length-prefixed.

A file is read as gzip when it starts with gzip's magic bytes (Chakra's tools write `.et.gz`), whatever its
name; it is written as gzip only when its name ends in `.gz` (ASTRA-sim's feeder reads no gzip).
"""

from __future__ import annotations

import functools
import gzip
import inspect
import io
import zlib
from collections.abc import Generator, Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from etweave.errors import BadInput
from etweave.output import FileBytes, write_together
from etweave.read.source import input_limit, open_binary

if TYPE_CHECKING:
    from etweave.chakra import et_def_pb2 as pb

SCHEMA_VERSION = "0.0.4"
GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20  # bytes read at a time: memory stays bounded by the largest message, not the file
_MAX_VARINT = 10  # bytes of a 64-bit varint
_ByteStream = BinaryIO | gzip.GzipFile  # what the .et reader reads from: a file, a pipe's bytes, or a gunzip view


BYTE_VARINTS = [bytes((i,)) for i in range(0x80)]  # one-byte varints, by value
# 14 bits at a time: the last two bytes of a varint (0x80 <= value < 0x4000), and two bytes with more to come.
# Value v's pair is (v & 0x7F | 0x80, v >> 7), its second byte | 0x80 in _TWO_MORE; built from byte strings
# in C passes (no Python step per value: the tables are built at import).
_LOW_BYTES = bytes(range(0x80, 0x100)) * 0x80
TWO_BYTE_VARINTS = list(map(bytes, zip(_LOW_BYTES, b"".join(bytes((h,)) * 0x80 for h in range(0x80)), strict=True)))
_TWO_MORE = list(map(bytes, zip(_LOW_BYTES, b"".join(bytes((h | 0x80,)) * 0x80 for h in range(0x80)), strict=True)))
# For encoders that split a value v >= 0x4000 themselves: its varint is LOW_14_MORE[v & 0x3FFF] followed by the
# varint of v >> 14, which VARINTS_14 holds whole while v >> 14 < 0x4000 (every v below 2**28).
LOW_14_MORE = _TWO_MORE
VARINTS_14 = BYTE_VARINTS + TWO_BYTE_VARINTS[0x80:]  # the varint of every value below 0x4000


def varint_bytes(value: int) -> bytes:
    """Protobuf's base-128 varint of 0 <= value (callers check the field's range): seven bits a byte, low first,
    the high bit set on every byte but the last (our own: protobuf's helper is internal)."""
    if value < 0x80:
        return BYTE_VARINTS[value]
    if value < 0x4000:
        return TWO_BYTE_VARINTS[value]
    out = _TWO_MORE[value & 0x3FFF]
    value >>= 14
    while value >= 0x4000:
        out += _TWO_MORE[value & 0x3FFF]
        value >>= 14
    return out + (BYTE_VARINTS[value] if value < 0x80 else TWO_BYTE_VARINTS[value])


def decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it). IndexError when `buf` ends inside the varint, ValueError when it is overlong."""
    result = shift = 0
    for i in range(pos, pos + _MAX_VARINT):
        b = buf[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i + 1
        shift += 7
    raise ValueError(f"length prefix at byte {pos} is longer than {_MAX_VARINT} bytes")


def _encoded(msg: pb.GlobalMetadata | pb.Node) -> bytes:
    return msg.SerializeToString(deterministic=True)  # deterministic: the same input gives the same bytes


def metadata_bytes(metadata: pb.GlobalMetadata) -> bytes:
    """The GlobalMetadata's bytes. Its version must be set: an empty message reads as end of file."""
    if not metadata.version:
        raise ValueError("GlobalMetadata.version must be set: an empty message reads as end of file")
    return _encoded(metadata)


def _stream(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> Iterator[bytes]:
    return stream_encoded(metadata_bytes(metadata), (_encoded(node) for node in nodes))


def stream_encoded(metadata: bytes, nodes: Iterable[bytes]) -> Iterator[bytes]:
    """The .et stream of the metadata and nodes already encoded (`metadata_bytes` or
    `etweave.nodes.encode_metadata`, and `etweave.nodes.encode_nodes`), in chunks of about `_CHUNK` bytes (a
    write per node would cost more than the encoding)."""
    if not metadata:
        raise ValueError("an empty GlobalMetadata reads as end of file")
    parts, size = [varint_bytes(len(metadata)), metadata], 0
    for data in nodes:
        n = len(data)
        parts.append(BYTE_VARINTS[n] if n < 0x80 else TWO_BYTE_VARINTS[n] if n < 0x4000 else varint_bytes(n))
        parts.append(data)
        size += n
        if size >= _CHUNK:
            yield b"".join(parts)
            parts, size = [], 0
    yield b"".join(parts)


def stream_framed(metadata: bytes, framed: Iterable[bytes]) -> Iterator[bytes]:
    """The .et stream of the metadata encoded and the nodes already framed (each after its length, as
    `etweave.nodes.EncodedNodes.framed` gives them), in the chunks given."""
    if not metadata:
        raise ValueError("an empty GlobalMetadata reads as end of file")
    return chain((varint_bytes(len(metadata)) + metadata,), framed)


def framed_et_chunks(path: Path, metadata: bytes, framed: Iterable[bytes]) -> Iterator[bytes]:
    """`encoded_et_chunks` of nodes already framed (`stream_framed`)."""
    chunks = stream_framed(metadata, framed)
    return gzipped(chunks) if is_gz_name(path) else chunks


def gzipped(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """gzip of the chunks, streamed. zlib's gzip header has no name and mtime 0: the same input, the same bytes."""
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: gzip container
    for chunk in chunks:
        out = comp.compress(chunk)
        if out:
            yield out
    yield comp.flush()


def serialize(metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> bytes:
    """The .et stream in memory (a whole-run conversion ships ranks between processes this way)."""
    return b"".join(_stream(metadata, nodes))


def serialize_encoded(metadata: bytes, nodes: Iterable[bytes]) -> bytes:
    """`serialize` of the metadata and nodes already encoded."""
    return b"".join(stream_encoded(metadata, nodes))


def serialize_framed(metadata: bytes, framed: Iterable[bytes]) -> bytes:
    """`serialize` of the metadata encoded and the nodes already framed (`etweave.nodes.EncodedNodes.framed`)."""
    return b"".join(stream_framed(metadata, framed))


def is_gz_name(path: Path | str) -> bool:
    return str(path).endswith(".gz")


def write_et(path: Path, metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> None:
    """Stream to a temporary file beside `path`, renamed only once complete; gzip when `path` ends in `.gz`."""
    write_together([FileBytes(path, et_chunks(path, metadata, nodes))])


def et_chunks(path: Path, metadata: pb.GlobalMetadata, nodes: Iterable[pb.Node]) -> Iterator[bytes]:
    """The bytes of a .et file named `path`, streamed: gzip when the name ends in `.gz`."""
    return encoded_et_chunks(path, metadata_bytes(metadata), (_encoded(node) for node in nodes))


def encoded_et_chunks(path: Path, metadata: bytes, nodes: Iterable[bytes]) -> Iterator[bytes]:
    """`et_chunks` of the metadata and nodes already encoded."""
    chunks = stream_encoded(metadata, nodes)
    return gzipped(chunks) if is_gz_name(path) else chunks


def et_files(paths: Iterable[Path]) -> list[Path]:
    """The .et files named: a file as it is, a folder as every `*.et` and `*.et.gz` in it (sorted)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in [*path.glob("*.et"), *path.glob("*.et.gz")] if p.is_file())
            if not found:
                raise BadInput(path, "no .et files in this folder")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise BadInput(path, "no such file or folder")
    return files


def _raw_messages(stream: _ByteStream, path: Path | str) -> Iterator[bytes]:
    """Each length-prefixed message's bytes, reading `stream` a chunk at a time."""
    buf, pos, base, eof = b"", 0, 0, False  # base: file offset of buf[0], for messages
    limit = input_limit()
    while True:
        try:
            size, start = decode_varint(buf, pos)
        except IndexError:
            size, start = -1, -1
        except ValueError as exc:
            raise BadInput(path, f"not a Chakra .et stream: {exc}") from exc
        if start >= 0 and start + size <= len(buf) and size <= limit:
            yield buf[start : start + size]
            pos = start + size
            continue
        _check_frame(path, base, pos, start, size, limit, len(buf) if eof else None)
        if eof:
            return
        base += pos
        buf, eof = _refilled(stream, path, buf, pos, start, size)
        pos = 0


def _refilled(stream: _ByteStream, path: Path | str, buf: bytes, pos: int, start: int, size: int) -> tuple[bytes, bool]:
    """`buf` from `pos` on with the next chunk read after it (enough for the whole message at `start` when its
    `size` is known, at most 64 chunks at once), and whether the stream had ended."""
    want = _CHUNK if start < 0 else max(_CHUNK, min(start + size - len(buf), 64 * _CHUNK))
    chunk = _read(stream, want, path)
    return buf[pos:] + chunk, not chunk


def _raw_batches(stream: _ByteStream, path: Path | str) -> Iterator[list[bytes]]:
    """`_raw_messages`' messages (the same rules, the same errors at the same message), a list of them per chunk
    read: the messages whose length prefix has one or two bytes (every node etweave writes below 16 KiB) are cut
    in one loop with the prefix read inline (`_cut_short`), with no generator step per message (a reader that
    decodes only a few fields of each node spends as much on stepping through the stream as on the rest:
    etweave/simulate/reader.py). The messages before a bad one are yielded before its error is raised."""
    buf, pos, base, eof = b"", 0, 0, False  # base: file offset of buf[0], for messages
    limit = input_limit()
    out: list[bytes] = []
    while True:
        pos = _cut_short(buf, pos, limit, out)
        try:
            size, start = decode_varint(buf, pos)
        except IndexError:
            size, start = -1, -1
        except ValueError as exc:
            if out:
                yield out
                out = []
                continue  # (the same error again, the messages before it given out)
            raise BadInput(path, f"not a Chakra .et stream: {exc}") from exc
        if start >= 0 and start + size <= len(buf) and size <= limit:
            out.append(buf[start : start + size])
            pos = start + size
            continue
        if out:
            yield out
            out = []
        _check_frame(path, base, pos, start, size, limit, len(buf) if eof else None)
        if eof:
            return
        base += pos
        buf, eof = _refilled(stream, path, buf, pos, start, size)
        pos = 0


def _cut_short(buf: bytes, pos: int, limit: int, out: list[bytes]) -> int:
    """Append to `out` the whole messages from `pos` on whose length prefix has one or two bytes, up to the first
    that has not (or is not all in `buf`, or is over `limit`); the position after them."""
    append, n = out.append, len(buf)
    while pos + 1 < n:  # (a prefix's second byte is there to look at)
        size = buf[pos]
        if size < 0x80:
            start = pos + 1
        else:
            high = buf[pos + 1]
            if high >= 0x80:
                break  # three bytes or more: the general way
            size = (size & 0x7F) | high << 7
            start = pos + 2
        end = start + size
        if end > n or size > limit:
            break
        append(buf[start:end])
        pos = end
    return pos


def _check_frame(path: Path | str, base: int, pos: int, start: int, size: int, limit: int, end: int | None) -> None:
    """`_raw_messages`' errors at the message whose prefix is at `pos` (its bytes from `start` on, -1 when the
    prefix is not all read), not all read: over the limit, or, at the end of the stream (`end`: the bytes read;
    None before), truncated. `base`: the file offset of position 0."""
    if start >= 0 and size > limit:  # a (gzip) bomb or garbage: refuse before buffering it
        raise BadInput(path, f"message at byte {base + start} claims {size} bytes, more than the {limit} byte "
                             "input limit")
    if end is None or pos == end:
        return
    if start < 0:
        raise BadInput(path, f"truncated length prefix at byte {base + pos}")
    raise BadInput(path, f"truncated message at byte {base + start}: needs {size} bytes, {end - start} left")


def _read(stream: _ByteStream, size: int, path: Path | str) -> bytes:
    try:
        return stream.read(size)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise BadInput(path, f"corrupt gzip data: {exc}") from exc


def _open(path: Path) -> tuple[BinaryIO, _ByteStream]:
    """(the file, what to read from it): the file itself, or a gunzipping view of it."""
    raw = open_binary(path)  # a pipe is read whole first; a device or a folder is refused
    try:
        gz = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
    except OSError as exc:
        raw.close()
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc
    return raw, (gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw)


def _parse_stream(messages: Iterator[bytes], path: Path | str) -> Iterator[pb.GlobalMetadata | pb.Node]:
    """The GlobalMetadata first, then every Node."""
    from etweave.chakra import et_def_pb2 as pb  # here: writing a converted trace needs no protobuf

    try:
        first = next(messages, None)
        if first is None:
            raise BadInput(path, "empty file: no GlobalMetadata")
        metadata = pb.GlobalMetadata()
        metadata.ParseFromString(first)
        yield metadata
        for raw in messages:
            node = pb.Node()
            node.ParseFromString(raw)
            yield node
    except BadInput:
        raise
    except Exception as exc:  # protobuf's DecodeError
        raise BadInput(path, f"not a Chakra .et stream: {exc}") from exc


def iter_et(path: Path) -> tuple[pb.GlobalMetadata, Iterator[pb.Node]]:
    """The metadata, and the nodes one at a time (plain or gzip): memory independent of the file's size."""
    path = Path(path)
    raw, stream = _open(path)

    def messages() -> Generator[pb.GlobalMetadata | pb.Node, None, None]:
        with raw, stream:
            yield from _parse_stream(_raw_messages(stream, path), path)

    it = messages()
    try:
        metadata = next(it)
    except BaseException:
        it.close()
        raise
    # _parse_stream yields the GlobalMetadata first, then only Nodes
    return cast("pb.GlobalMetadata", metadata), cast("Iterator[pb.Node]", it)


def iter_et_raw(path: Path) -> tuple[pb.GlobalMetadata, Iterator[list[bytes]]]:
    """The metadata, and the nodes' serialized bytes, unparsed, a list of them per chunk of the file read (for a
    reader that decodes only what it needs: etweave/simulate/reader.py). The stream's framing is checked as
    `iter_et` checks it."""
    path = Path(path)
    raw, stream = _open(path)

    def batches() -> Generator[list[bytes], None, None]:
        with raw, stream:
            yield from _raw_batches(stream, path)

    it = batches()
    try:
        first = next(it, None)
        if first is None:
            raise BadInput(path, "empty file: no GlobalMetadata")
        metadata = next(_parse_stream(iter(first[:1]), path))
    except BaseException:
        it.close()
        raise
    rest = first[1:]
    return cast("pb.GlobalMetadata", metadata), chain((rest,) if rest else (), it)


def read_et(path: Path) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """Read a whole `.et` (or `.et.gz`) file: metadata and nodes."""
    metadata, nodes = iter_et(path)
    return metadata, list(nodes)


def parse(data: bytes, path: Path | str = "<memory>") -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """The inverse of `serialize`: a GlobalMetadata, then the nodes."""
    it = _parse_stream(_raw_messages(io.BytesIO(data), path), path)
    metadata = next(it)
    return cast("pb.GlobalMetadata", metadata), cast("list[pb.Node]", list(it))  # metadata first, then only Nodes


def attr_value(attr: pb.AttributeProto) -> object:
    """The Python value of an attribute, whichever oneof it uses."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    return list(value.values) if kind.endswith("_list") else value


def node_attrs(node: pb.Node) -> dict[str, object]:
    return {a.name: attr_value(a) for a in node.attr}


@functools.cache
def _all_fields() -> dict[str, Any]:
    """protobuf renamed MessageToDict's "print fields left at their default" option in 5.26 (the old name is gone
    in 6.x); etweave supports both sides of that (README: protobuf floor)."""
    from google.protobuf.json_format import MessageToDict  # only the JSON views need it: not imported by convert

    return ({"always_print_fields_with_no_presence": True}
            if "always_print_fields_with_no_presence" in inspect.signature(MessageToDict).parameters
            else {"including_default_value_fields": True})


def message_dict(msg: pb.GlobalMetadata | pb.Node) -> dict[str, object]:
    """One message as `etweave jsonize` prints it: proto field names, fields at their default included."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(msg, preserving_proto_field_name=True, **_all_fields())


def to_json(metadata: pb.GlobalMetadata, nodes: list[pb.Node]) -> dict[str, object]:
    """A JSON-able view of a trace, as `etweave jsonize` prints it."""
    return {"metadata": message_dict(metadata), "nodes": [message_dict(n) for n in nodes]}


def chakra_json(msg: pb.GlobalMetadata | pb.Node) -> str:
    """One message exactly as Chakra's `chakra_jsonizer` writes it: `MessageToJson` with its defaults (JSON
    camelCase names, fields at their default left out, 64-bit integers as strings, indent 2)."""
    from google.protobuf.json_format import MessageToJson

    return MessageToJson(msg)
