"""`bench.launch`: a command started from the launcher reads its own peak RSS, not the benchmark process's; one
started from a process that once held more reads that (Linux carries ru_maxrss over exec), which is why the
benchmarks use it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.launch import Launcher

TINY = [sys.executable, "-c", "import sys; sys.stderr.write('x' * 3000); sys.exit(3)"]
HELD = 400 * 2**20


def test_a_launched_command_reads_its_own_peak_rss(tmp_path: Path) -> None:
    launcher = Launcher()  # started while this process is small
    try:
        held = bytearray(HELD)
        held[::4096] = b"x" * len(held[::4096])  # touched: resident
        proc = subprocess.Popen(TINY, stderr=subprocess.DEVNULL)
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
        del held
        direct_kib = usage.ru_maxrss
        done = launcher.run(TINY, tmp_path)
    finally:
        launcher.close()
    assert direct_kib * 1024 >= HELD  # from this process: at least what it held
    assert done.rss_kib * 1024 < HELD // 4  # from the launcher: the command's own
    assert done.rc == 3 and done.err == "x" * 2000 and done.cpu_s > 0 and done.wall_s >= done.cpu_s / 4


def test_launched_command_writes_its_stdout_where_asked(tmp_path: Path) -> None:
    launcher = Launcher()
    try:
        done = launcher.run([sys.executable, "-c", "import os; print(os.getcwd(), os.environ['X'])"], tmp_path,
                            {**os.environ, "X": "y"}, tmp_path / "out.txt")
    finally:
        launcher.close()
    assert done.rc == 0
    assert (tmp_path / "out.txt").read_text().split() == [str(tmp_path), "y"]
