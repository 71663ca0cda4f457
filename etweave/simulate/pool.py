"""Many `.et` files loaded at once: each read by a worker process, handed back as msgpack bytes (both replays).

Reading a file (`etweave.simulate.reader`) is one Python step per node, about half of a whole `simulate`; decoding
the same rank from msgpack costs a tenth of that. So workers read files side by side with this process, which
decodes what they hand back and keeps the file order: what the replays get is the same as a load in this process (a rank
struct compares equal), the strings that repeat over nodes and ranks interned again (`finish`), and the first bad
file in file order is the error raised, as loading one file after the other would raise it.

This process reads every `jobs`-th file itself (a rank it reads needs no decoding): with 2 CPUs it and one worker
each read half. Starting a worker costs about as much as reading 3 files, so each reader gets at least FILES_EACH
files, and fewer than MIN_FILES load in this process alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec

from etweave.errors import BadInput
from etweave.nogc import no_gc
from etweave.progress import Stage, counted, stage

if TYPE_CHECKING:  # (the pool's modules are imported only when a pool is started)
    from concurrent.futures import Executor, Future

R = TypeVar("R", bound=msgspec.Struct)
Load = Callable[[Path, "int | None"], R]

FILES_EACH = 8  # a worker's start (its imports) costs about 3 files' read: each reader gets at least this many
MIN_FILES = 2 * FILES_EACH  # fewer files load in this process alone


def load_files(files: Sequence[Path], load: Load[R], rank_type: type[R], finish: Callable[[R], R],
               default_rank: int | None = None, jobs: int = 1) -> list[R]:
    """`load(file, default_rank)` of every file, in file order: in this process, or with `jobs` > 1 and at least
    MIN_FILES files by this process and up to `jobs` - 1 workers (FILES_EACH files or more each), every `jobs`-th
    file here (`load` must then be a module-level function). `finish` is given each rank decoded from a worker
    (`intern_strings` of the rank's loader). Progress: a "loading" stage."""
    jobs = min(jobs, len(files) // FILES_EACH)  # (below MIN_FILES: 1)
    if jobs <= 1:
        return [load(f, default_rank) for f in counted(files, "loading", len(files), "files", chunk=1)]
    decode = msgspec.msgpack.Decoder(rank_type).decode
    return _with_workers(files, load, lambda raw: finish(decode(raw)), default_rank, jobs)


def _with_workers(files: Sequence[Path], load: Load[R], decode: Callable[[bytes], R], default_rank: int | None,
                  jobs: int) -> list[R]:
    """`load_files` by this process and `jobs` - 1 workers."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: the parent may hold threads (a progress bar, a caller's Dask client) that fork would copy in
    # an undefined state (as convert-run's pool)
    with stage("loading", len(files), "files") as bar, ProcessPoolExecutor(
            max_workers=jobs - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        shared = _Shared(files, load, decode, default_rank, jobs, pool, bar)
        try:
            shared.run()
        finally:
            pool.shutdown(cancel_futures=True)  # after a failure: the files still queued are not read
    if shared.failed:
        raise shared.failed[min(shared.failed)]  # the first bad file in file order, as one after the other
    return [shared.loaded[i] for i in range(len(files))]


class _Shared(Generic[R]):
    """The files shared between this process (every `jobs`-th) and the workers (the others), as they come in."""

    def __init__(self, files: Sequence[Path], load: Load[R], decode: Callable[[bytes], R], default_rank: int | None,
                 jobs: int, pool: Executor, bar: Stage) -> None:
        self.files, self.load, self.decode, self.default_rank, self.jobs = files, load, decode, default_rank, jobs
        self.pool, self.bar = pool, bar
        self.theirs = [i for i in range(len(files)) if i % jobs]  # the files the workers read, in order
        self.ahead = 4 * jobs  # worker files queued or read, not yet decoded here: their bytes wait in memory
        self.loaded: dict[int, R] = {}
        self.failed: dict[int, BadInput] = {}
        self.queued: dict[int, Future[bytes]] = {}

    def run(self) -> None:
        """This process's share, read while the workers read theirs; what they handed back is decoded between two
        of its files, never waited for (a worker's start takes about as long as a few files); then the rest, in
        order, up to the first failure."""
        self.refill()
        for i in range(0, len(self.files), self.jobs):
            try:
                self.loaded[i] = self.load(self.files[i], self.default_rank)
                self.bar.advance(1)
            except BadInput as exc:
                self.failed[i] = exc
            for j in [j for j, f in self.queued.items() if f.done()]:
                self.take(j)
            if self.failed:
                break
            self.refill()
        while self.queued and not (self.failed and min(self.failed) < min(self.queued)):
            self.take(min(self.queued))
            self.refill()

    def take(self, j: int) -> None:
        try:
            self.loaded[j] = self.decode(self.queued.pop(j).result())
        except BadInput as exc:  # (raised by the worker: it pickles whole, `BadInput.__reduce__`)
            self.failed[j] = exc
        self.bar.advance(1)

    def refill(self) -> None:
        while self.theirs and len(self.queued) < self.ahead:
            j = self.theirs.pop(0)
            self.queued[j] = self.pool.submit(_load_encoded, self.load, str(self.files[j]), self.default_rank)


def _load_encoded(load: Load[msgspec.Struct], path: str, default_rank: int | None) -> bytes:
    """In a worker: one file loaded and encoded (the collector off: see etweave.nogc)."""
    with no_gc():
        return msgspec.msgpack.encode(load(Path(path), default_rank))
