"""Progress on the terminal: one line on stderr per running stage (its name, the items done, the time spent).

Shown only when the command line turned it on (`configure`), stderr is a terminal and `--quiet` was not given;
the Python API and piped runs print nothing. Callers report work in chunks (`Stage.advance(n)`), never per node
in a hot loop, and a background thread redraws the line each second so that a stage without items still shows
its elapsed time."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading

_on = False
_verbose = False


def configure(enabled: bool, verbose: bool = False) -> None:
    """Turn progress on or off for this process (the CLI: on unless --quiet); `verbose`: each stage's name and
    time on stderr when it ends, terminal or not (the CLI's --verbose)."""
    global _on, _verbose
    _on, _verbose = enabled, verbose


def shown() -> bool:
    return _on and sys.stderr.isatty()


@contextlib.contextmanager
def muted() -> Iterator[None]:
    """No progress inside (work whose caller already shows a bar of its own)."""
    global _on
    was, _on = _on, False
    try:
        yield
    finally:
        _on = was


class Stage:
    """A running stage. Without a terminal every method does nothing."""

    def __init__(self, name: str, total: int | None = None, unit: str = "") -> None:
        self._bar: Any = None
        self._stop: threading.Event | None = None
        self._name, self._unit, self._started, self._done = name, unit or 'items', time.perf_counter(), 0
        if not shown():
            return
        import threading  # only with a terminal to draw on

        from tqdm import tqdm

        # tqdm sizes the line from the terminal and draws nothing when it reports 0 columns or rows; shutil falls
        # back to $COLUMNS/$LINES, then 80 x 24.
        columns, rows = shutil.get_terminal_size()
        fmt = "{desc}: {elapsed}" if total is None else None
        self._bar = tqdm(total=total, desc=f"etweave: {name}", unit=f" {unit}" if unit else "it", file=sys.stderr,
                         leave=False, ncols=columns, nrows=rows, mininterval=0.5, bar_format=fmt, unit_scale=bool(unit))
        self._bar.refresh()
        self._stop = stop = threading.Event()
        threading.Thread(target=self._tick, args=(stop,), daemon=True).start()

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            self._bar.refresh()

    def advance(self, n: int = 1) -> None:
        self._done += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            if self._stop is not None:
                self._stop.set()
            self._bar.close()
            self._bar = None
        if _verbose and _on:
            items = f", {self._done:,} {self._unit}" if self._done else ""
            print(f"etweave: {self._name}: {time.perf_counter() - self._started:.1f} s{items}", file=sys.stderr)


@contextlib.contextmanager
def stage(name: str, total: int | None = None, unit: str = "") -> Iterator[Stage]:
    """`with stage("reading Kineto trace"): ...` shows the stage while its body runs."""
    s = Stage(name, total, unit)
    try:
        yield s
    finally:
        s.close()


def counted(items: Iterable[Any], name: str, total: int | None = None, unit: str = "", chunk: int = 4096
            ) -> Iterator[Any]:
    """`items`, passed through, counted on a stage in chunks of `chunk` (no per-item cost but a generator step; none
    at all when there is nothing to show: the items' own iterator is returned)."""
    if not (shown() or (_verbose and _on)):  # (what `Stage` draws or prints: nothing)
        return iter(items)
    return _counted(iter(items), name, total, unit, chunk)


def _counted(items: Iterator[Any], name: str, total: int | None, unit: str, chunk: int) -> Iterator[Any]:
    with stage(name, total, unit) as s:
        while batch := list(itertools.islice(items, chunk)):
            yield from batch
            s.advance(len(batch))
