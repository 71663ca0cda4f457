"""Writing outputs: all or nothing. Each output is written to a temporary file beside its target (`stage`), and
only once every output of a command is complete are they renamed into place together (`commit`); a file already
there is moved aside first and put back if a later rename fails, so a failed run leaves no output new or changed.
Output paths are checked before any work (`check_outputs`), and temporary files that a killed run left behind
are removed by the next run into that folder (`clean_stale`). A command hands all its outputs to `write_together`
(each a `Writer`: a target and its bytes, produced only when staged), which does all of that."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import msgspec
import orjson

from etweave.errors import BadInput

# .<name>.tmp-<pid> (being written), .<name>.old-<pid> (the previous output, moved aside during a commit)
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def _temp_name(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}")


def _problem(exc: OSError) -> str:
    return f"cannot write: {exc.strerror or exc}"


Content = Iterable[bytes] | bytes  # a file's bytes: whole, or streamed in chunks


class Writer(Protocol):
    """One output file of a command: where it goes and its bytes. `content` is called only when the file is
    staged, so a streamed output is never held whole and outputs are produced in the order given."""

    @property
    def path(self) -> Path: ...

    def content(self) -> Content: ...


class FileBytes(msgspec.Struct, frozen=True):
    """A Writer of bytes already made (or a stream already opened)."""

    path: Path
    data: Content

    def content(self) -> Content:
        return self.data


class JsonFile(msgspec.Struct, frozen=True):
    """A Writer of a JSON document as `json_bytes` writes it (a report, a comm-group map)."""

    path: Path
    obj: object

    def content(self) -> Content:
        return json_bytes(self.obj)


def write_together(outputs: Iterable[Writer], inputs: Sequence[Path | None] = (), clean: bool = True) -> list[Path]:
    """Stage every output in turn, then rename them all into place together: all or nothing, a failure anywhere
    (also one raised while producing an output's bytes) leaves no output new or changed. An output that is one
    of `inputs` is refused before anything is written. `clean` as for `stage`. The targets, in order."""
    outputs = list(outputs)
    refuse_inputs([("output", w.path) for w in outputs], inputs)
    staged: list[tuple[Path, Path]] = []
    try:
        for writer in outputs:
            target = Path(writer.path)
            staged.append((stage(target, writer.content(), clean), target))
    except BaseException:
        discard([tmp for tmp, _ in staged])
        raise
    commit(staged)
    return [target for _, target in staged]


def stage(path: Path, chunks: Iterable[bytes] | bytes, clean: bool = True) -> Path:
    """Write `chunks` completely to a temporary file beside `path`; its path, for `commit`. On any failure (also
    one raised by the producer of `chunks`) the temporary file is removed and the error goes on. `clean`: first
    remove stale temporary files of this target (a caller that cleaned the whole folder once passes False: a
    scan per output would be quadratic in a run of many ranks)."""
    path = Path(path)
    if clean:
        clean_stale(path.parent, path.name)
    tmp = _temp_name(path, "tmp")
    try:
        with open(tmp, "wb", buffering=1 << 20) as out:
            if isinstance(chunks, bytes | bytearray):
                out.write(chunks)
            else:
                for chunk in chunks:
                    out.write(chunk)
    except BaseException as exc:
        discard([tmp])
        if isinstance(exc, OSError):
            raise BadInput(path, _problem(exc)) from exc
        raise
    return tmp


def commit(moves: Sequence[tuple[Path, Path]]) -> None:
    """Rename each staged file onto its target, all or nothing: on a failed rename the targets already renamed
    are removed, the previous files put back, and the staged files removed."""
    backups: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    target = None
    try:
        for tmp, target in moves:
            if target.exists() and not target.is_dir():
                old = _temp_name(target, "old")
                os.replace(target, old)
                backups.append((old, target))
            os.replace(tmp, target)
            placed.append(target)
    except OSError as exc:
        for path in reversed(placed):
            with contextlib.suppress(OSError):
                path.unlink()
        for old, path in reversed(backups):
            with contextlib.suppress(OSError):  # a second failure must not hide the first
                os.replace(old, path)
        discard([tmp for tmp, _ in moves])
        raise BadInput(target or "output", _problem(exc)) from exc
    discard([old for old, _ in backups])


def discard(paths: Iterable[Path]) -> None:
    """Remove temporary files; a failure here (a read-only file system) must not replace the error being reported."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def write_atomic(path: Path, chunks: Content) -> None:
    """One output, whole or not at all (`write_together` of one)."""
    write_together([FileBytes(Path(path), chunks)])


def json_bytes(obj: object) -> bytes:
    """Indented, keys sorted: the same report gives the same bytes."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def write_json(path: Path, obj: object) -> None:
    write_atomic(path, json_bytes(obj))


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive, leave its files
        return True
    except OverflowError:  # no process has that id
        return False
    return True


def clean_stale(folder: Path, name: str | None = None) -> None:
    """Remove the temporary files of runs that were killed (their process is gone) in `folder` (only those of
    target `name` when given). A moved-aside previous output whose target is missing is put back: its commit
    never finished. A live run's files are never touched."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m is None or (name is not None and m["name"] != name) or pid_alive(int(m["pid"])):
            continue
        path, target = Path(entry.path), Path(folder) / m["name"]
        with contextlib.suppress(OSError):
            if m["kind"] == "old" and not target.exists():
                os.replace(path, target)
            else:
                path.unlink()


def check_outputs(outputs: Sequence[tuple[str, Path]], inputs: Sequence[Path | None]) -> None:
    """Before any work: every output (labelled by its option) can be written, is not an input, and no two
    outputs are the same file. Bad input otherwise, naming the path."""
    seen: dict[Path, str] = {}
    given = [Path(p) for p in inputs if p is not None]
    for label, out in outputs:
        out = Path(out)
        resolved = out.resolve()
        if resolved in seen:
            raise BadInput(out, f"given as both {seen[resolved]} and {label}: one would overwrite the other")
        seen[resolved] = label
        refuse_inputs([(label, out)], given)
        if out.is_dir():
            raise BadInput(out, f"{label} is a folder, not a file")
        if out.exists() and not out.is_file():  # a device, a pipe: renaming onto it would replace it
            raise BadInput(out, f"{label} is not a regular file")
        writable_folder(out.parent, label)


def refuse_inputs(outputs: Sequence[tuple[str, Path]], inputs: Sequence[Path | None]) -> None:
    """Bad input when an output (labelled by its option) is one of the input files: it would be overwritten."""
    given = [Path(p) for p in inputs if p is not None]
    for label, out in outputs:
        for inp in given:
            if _same_file(Path(out), inp):
                raise BadInput(out, f"{label} is also an input: it would be overwritten")


def writable_folder(folder: Path, label: str) -> None:
    """`folder` exists, is a folder, and a file can be created in it (tried: permissions, read-only mounts and
    full quotas all answer)."""
    folder = Path(folder) if str(folder) else Path(".")
    if not folder.exists():
        raise BadInput(folder, f"the folder of {label} does not exist")
    if not folder.is_dir():
        raise BadInput(folder, f"the folder of {label} is not a folder")
    probe = folder / f".etweave-probe.tmp-{os.getpid()}"
    try:
        probe.open("wb").close()
    except OSError as exc:
        raise BadInput(folder, f"cannot write into the folder of {label}: {exc.strerror or exc}") from exc
    discard([probe])


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on an output folder while a run writes into it: a second run into the same folder
    is refused at once instead of mixing its files with the first's. The kernel frees the lock when the process
    ends, however it ends, so a killed run never blocks the next one."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise BadInput(folder, "another etweave run is writing into this folder: wait for it to end or choose "
                                   "another output folder") from exc
        # holding the lock, no live run uses a .etweave-run-* folder (convert-run's spool): any here is stale
        for entry in os.scandir(folder):
            if entry.name.startswith(".etweave-run-") and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
        clean_stale(folder)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_folder(folder: Path) -> Iterator[None]:
    """Create `folder` (and missing parents) for a run's outputs and lock it; the folders created are removed
    again if the run fails before writing anything into them."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise BadInput(folder, "-o exists and is not a folder")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    writable_folder(existing, "-o")
    created = [p for p in [folder, *folder.parents] if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(folder, f"cannot create the folder: {exc.strerror or exc}") from exc
    try:
        with folder_lock(folder):
            yield
    except BaseException:
        for p in created:  # innermost first; only while empty: a concurrent run may have written there
            with contextlib.suppress(OSError):
                p.rmdir()
        raise
