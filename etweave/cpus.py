"""The CPUs this process may use: the default size of every process pool (convert-run's, simulate's loading)."""

from __future__ import annotations

import os


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
