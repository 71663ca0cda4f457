"""The cyclic garbage collector paused: the one home of that rule for the pipeline, its workers and the CLI."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The collector off inside, as it was after. A conversion builds millions of acyclic objects (and importing
    a command's modules thousands): the collector would rescan them again and again (a third of a conversion's
    time) and free nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
