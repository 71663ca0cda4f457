"""Bytes of an input file, plain or gzip, with limits against hostile input.

A regular file is read directly; a pipe (`--host /dev/stdin`, `<(zcat trace.json.gz)`, a named FIFO) is read to
its end; anything else (a device such as /dev/zero, a socket, a folder) is refused. A named FIFO that no process
writes to is refused after a bounded wait instead of blocking forever. What an input may decompress to is
limited (`input_limit`) so a gzip bomb fails with a clear message instead of exhausting memory."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import resource
import select
import stat
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from etweave.errors import BadInput

if TYPE_CHECKING:
    import threading

# The parsed trace and the pipeline's data take a few times the JSON's size (the converter peaks at about 2x its
# input on the largest traces): an input is limited to this fraction of the memory the process may use, so a
# bomb is refused before it exhausts memory, while a 1 GB trace still fits a 24 GB machine (limit ~6 GB).
MEMORY_SHARE = 4
# A named pipe must start delivering within this many seconds (ETWEAVE_PIPE_WAIT overrides it).
PIPE_WAIT_SECONDS = 30.0


def memory_budget() -> int | None:
    """Bytes this process may allocate: the smaller of available memory (cgroup limit included) and the
    address-space limit (RLIMIT_AS); None when neither is known."""
    candidates: list[int] = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        candidates.append(soft)
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdecimal():
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip() or 0)
            candidates.append(max(0, int(limit) - used))
    return min(candidates) if candidates else None


def input_limit() -> int:
    """How many bytes one input may hold (decompressed): ETWEAVE_MAX_INPUT_BYTES, else a share of the memory
    budget (at least 64 MiB, so a small machine still reads ordinary traces)."""
    value = os.environ.get("ETWEAVE_MAX_INPUT_BYTES", "")
    if value.isdecimal():
        return int(value)
    budget = memory_budget()
    return max(64 << 20, budget // MEMORY_SHARE) if budget is not None else 32 << 30


_CHUNK = 1 << 22


# Files being read ahead (`reading_ahead`): path -> (its thread, where the thread puts the bytes or the error).
_ahead: dict[str, tuple[threading.Thread, dict[str, Any]]] = {}


@contextlib.contextmanager
def reading_ahead(paths: Sequence[Path]) -> Iterator[None]:
    """Read these regular files (gunzipping them) on threads while the caller does other work, such as importing
    the modules that will parse them (decompressing and reading release the interpreter's lock); `read_bytes` of
    one of them waits for its thread and takes its bytes, or raises what reading it raised, the same error at the
    same point as reading it then. What was not taken is dropped on leaving. A pipe or a special file is left to
    `read_bytes` (reading a pipe ahead would consume it even if the command stopped before needing it)."""
    import threading  # only for the commands that read ahead

    started: list[str] = []
    for path in paths:
        key = os.fspath(path)
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except OSError:
            continue
        if regular and key not in _ahead:
            box: dict[str, Any] = {}
            thread = threading.Thread(target=_read_into, args=(path, box), daemon=True)
            thread.start()
            _ahead[key] = (thread, box)
            started.append(key)
    try:
        yield
    finally:
        for key in started:
            _ahead.pop(key, None)


def _read_into(path: Path, box: dict[str, Any]) -> None:
    try:
        box["data"] = _read_now(path, input_limit())
    except BaseException as exc:  # handed to the thread that takes the bytes, which raises it
        box["error"] = exc


def read_bytes(path: Path, limit: int | None = None) -> bytes | bytearray:
    """The file's content, gunzipped when it starts with the gzip magic, whatever its name (both JSON parsers
    take either type)."""
    ahead = _ahead.pop(os.fspath(path), None) if limit is None and _ahead else None
    if ahead is not None:
        thread, box = ahead
        thread.join()
        if "error" in box:
            raise box["error"]
        # popped, not read: the generator of `reading_ahead` holds its last box until it exits (after the
        # whole command), and would hold the file's bytes with it
        data: bytes | bytearray = box.pop("data")
        return data
    return _read_now(path, input_limit() if limit is None else limit)


def _read_now(path: Path, limit: int) -> bytes | bytearray:
    try:
        if _kind(path) == "pipe":
            raw = _read_pipe(path, limit)
            return _gunzip(io.BytesIO(raw), len(raw), path, limit) if raw[:2] == b"\x1f\x8b" else raw
        with open(path, "rb", buffering=0) as f:  # unbuffered: one copy of a large file, not two
            head = f.read(2)
            f.seek(0)
            size = os.fstat(f.fileno()).st_size
            if head != b"\x1f\x8b":
                return _read_regular(f, size, path, limit)
            return _gunzip(f, size, path, limit)
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc


def read_plain(path: Path, limit: int | None = None) -> bytes:
    """The file's bytes as they are (a .et file, a comm_group.json), under the same rules for special files."""
    limit = input_limit() if limit is None else limit
    try:
        if _kind(path) == "pipe":
            return _read_pipe(path, limit)
        with open(path, "rb", buffering=0) as f:
            return _read_regular(f, os.fstat(f.fileno()).st_size, path, limit)
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc


def open_binary(path: Path) -> BinaryIO:
    """A binary stream to read the file from (a reader that streams, like the .et reader): the file itself, or
    a pipe's bytes read whole first (under the input limit); a device or a folder is bad input."""
    try:
        if _kind(path) == "pipe":
            return io.BytesIO(_read_pipe(path, input_limit()))
        return open(path, "rb")  # the caller closes it
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror or exc}") from exc


def _kind(path: Path) -> str:
    """"file" or "pipe"; a folder or a device is bad input (/dev/zero would be read until memory runs out)."""
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        raise BadInput(path, "is a folder, not a file")
    if stat.S_ISFIFO(mode):
        return "pipe"
    if not stat.S_ISREG(mode):  # /dev/zero, /dev/urandom, a terminal, a socket: no end, or not a file
        raise BadInput(path, "is not a regular file or a pipe (a device?): cannot read from it")
    return "file"


def _read_regular(f: BinaryIO, size: int, path: Path, limit: int) -> bytes:
    if size > limit:
        raise BadInput(path, f"larger than the {limit} byte input limit (ETWEAVE_MAX_INPUT_BYTES)")
    return f.read()


def _pipe_wait() -> float:
    value = os.environ.get("ETWEAVE_PIPE_WAIT", "")
    try:
        return float(value) if value else PIPE_WAIT_SECONDS
    except ValueError:
        return PIPE_WAIT_SECONDS


def _read_pipe(path: Path, limit: int) -> bytes:
    """A pipe's bytes to its end. Opened without blocking (a FIFO with no writer would block `open` forever);
    until the first bytes arrive, waits at most ETWEAVE_PIPE_WAIT seconds; then reads to the end, at most
    `limit` bytes (the compressed size is bounded too)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        chunks: list[bytes] = []
        total = 0
        deadline = time.monotonic() + _pipe_wait()
        started = False
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:  # a writer, no data yet
                chunk = None
            if chunk == b"":
                # end of data, or no writer has opened the FIFO yet: only the first is an answer
                if started or _had_writer(fd):
                    break
                chunk = None
            if chunk is None:
                left = deadline - time.monotonic()
                if not started and left <= 0:
                    raise BadInput(path, f"a pipe that nothing wrote to within {_pipe_wait():g} s (no writer?)")
                if started:
                    select.select([fd], [], [], 1.0)
                else:  # select would answer at once on a FIFO without a writer: poll gently
                    time.sleep(min(max(left, 0.0), 0.05))
                continue
            started = True
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise BadInput(path, f"larger than the {limit} byte input limit (ETWEAVE_MAX_INPUT_BYTES)")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _had_writer(fd: int) -> bool:
    """Whether the EOF on a non-blocking FIFO read means the writer closed it (rather than none opened it yet):
    an anonymous pipe (/dev/stdin, process substitution) always had one; a named FIFO reports POLLHUP only
    after a writer came and went."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(ev & select.POLLHUP for _, ev in poller.poll(0))


class _BoundedBuffer:
    """Decompressed bytes in one buffer sized from a first guess; refuses to grow past the input limit."""

    __slots__ = ("limit", "out", "path", "pos")

    def __init__(self, guess: int, limit: int, path: Path) -> None:
        self.out = bytearray(guess)
        self.pos = 0
        self.limit = limit
        self.path = path

    def put(self, data: bytes) -> None:
        end = self.pos + len(data)
        if end > self.limit:
            raise BadInput(self.path, f"decompresses to more than the {self.limit} byte input limit (a gzip bomb? "
                                      "ETWEAVE_MAX_INPUT_BYTES sets the limit)")
        if end <= len(self.out):
            self.out[self.pos:end] = data
        else:  # the guess was short (over 4 GiB, or several members): grow
            self.out[self.pos:] = data
        self.pos = end


def _gunzip(f: BinaryIO, size: int, path: Path, limit: int) -> bytearray:
    """Decompress in bounded chunks (a bomb fails at the limit instead of exhausting memory) into a buffer sized
    from the gzip trailer, so a large trace is held once, not copied on every growth or at the end. Every member
    of a multi-member file is read, each under the same limit."""
    if size < 18:  # header and trailer alone take 18 bytes
        raise BadInput(path, "truncated gzip stream")
    f.seek(-4, os.SEEK_END)
    expected = int.from_bytes(f.read(4), "little")  # ISIZE: the size mod 2**32; only a first guess
    f.seek(0)
    # deflate expands at most ~1032:1, so a lying trailer cannot make us allocate more than that
    buf = _BoundedBuffer(min(expected, limit + 1, size * 1032), limit, path)
    try:
        if not _inflate_members(f, buf):
            raise BadInput(path, "truncated gzip stream")
    except (zlib.error, gzip.BadGzipFile, EOFError) as exc:
        raise BadInput(path, f"corrupt gzip data: {exc}") from exc
    except MemoryError as exc:
        raise BadInput(path, f"does not fit in memory once decompressed ({buf.pos} bytes so far)") from exc
    del buf.out[buf.pos:]
    return buf.out


def _inflate_members(f: BinaryIO, buf: _BoundedBuffer) -> bool:
    """Every gzip member of `f`, decompressed `_CHUNK` bytes at a time into `buf`; False when the last member
    has no end (a truncated stream)."""
    d = zlib.decompressobj(wbits=31)
    pending = b""
    while True:
        if not pending:
            pending = f.read(_CHUNK)
            if not pending:
                break
        if d.eof:  # the previous member ended and bytes follow: the next member
            d = zlib.decompressobj(wbits=31)
        buf.put(d.decompress(pending, _CHUNK))
        pending = d.unused_data if d.eof else d.unconsumed_tail
    while not d.eof:  # input ended: what zlib still holds, then the verdict
        data = d.decompress(b"", _CHUNK)
        if not data:
            break
        buf.put(data)
    return d.eof

