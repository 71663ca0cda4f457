"""Start the benchmarks' commands from a small process, so that each command's peak RSS is its own.

Linux carries a process's peak RSS (`ru_maxrss`) over `exec` from the process that forked it: a command started by
a benchmark process that once held 500 MB reads at least 500 MB, freed or not (`bench.simulate_floor` cut its
start-up run from a 224k-node file in its own process and read 587 MB for every command after). So each benchmark
starts this launcher first, while it is small, and the launcher forks every command: CPU (user + sys, its waited-for
children's too), peak RSS and wall time of each, from `os.wait4` in the launcher, sent back as one JSON line.

    launched = run([sys.executable, "-m", "etweave", "check", "out"], cwd=REPO)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypedDict

import orjson

REPO = Path(__file__).resolve().parents[1]


@dataclass(slots=True)
class Launched:
    wall_s: float  # from spawn to exit
    cpu_s: float  # user + sys
    rss_kib: int  # peak RSS of the command (the largest of it and the children it waited for)
    rc: int
    err: str  # the last 2000 bytes of its stderr


class Request(TypedDict):
    cmd: list[str]
    cwd: str
    env: dict[str, str] | None  # None: the launcher's (the benchmark's at its start)
    stdout: str | None  # a file, else discarded


def _run_one(request: Request) -> dict[str, object]:
    """One command, as the launcher runs it."""
    with tempfile.TemporaryFile() as err, open(request["stdout"] or os.devnull, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(request["cmd"], cwd=request["cwd"], env=request["env"], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = rc = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        err.seek(0)
        tail = err.read()[-2000:].decode(errors="replace").strip()
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_kib": usage.ru_maxrss, "rc": rc,
            "err": tail}


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The launcher: one JSON request per line in, one reply per line out, until its input closes."""
    for line in requests:
        replies.write(orjson.dumps(_run_one(orjson.loads(line))) + b"\n")
        replies.flush()


class Launcher:
    """A running launcher process; `run` starts a command through it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.launch"], cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def run(self, cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
            stdout: Path | None = None) -> Launched:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request: Request = {"cmd": cmd, "cwd": str(cwd), "env": env, "stdout": str(stdout) if stdout else None}
        self.proc.stdin.write(orjson.dumps(request) + b"\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError("the benchmark launcher stopped")
        return Launched(**orjson.loads(reply))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


_launcher: Launcher | None = None


def start() -> None:
    """Start this process's launcher now (a benchmark's first step, while it is small); `run` starts it else."""
    global _launcher
    if _launcher is None:
        _launcher = Launcher()


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, stdout: Path | None = None) -> Launched:
    """`cmd` run to completion from the launcher (`stdout` to that file, else discarded)."""
    start()
    assert _launcher is not None
    return _launcher.run(cmd, cwd, env, stdout)


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
