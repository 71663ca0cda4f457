"""Progress on a terminal (a pseudo-terminal reporting 0 columns, as some do) and none when piped or --quiet;
the CLI conventions: --debug after the subcommand, -q/-v everywhere, suggestions for mistyped words."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from etweave.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "etweave" / "examples" / "gloo_w2"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def on_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run `python -m etweave ARGS` with stdout and stderr on a pseudo-terminal of 0 x 0 cells; all it drew."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    env = {k: v for k, v in ENV.items() if k != "COLUMNS"}
    proc = subprocess.Popen([sys.executable, "-m", "etweave", *args], stdout=follower, stderr=follower,
                            stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(), b"".join(chunks).decode(errors="replace")


def piped(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etweave", *args], capture_output=True, text=True, cwd=cwd,
                          env=ENV)


CONVERT = ["convert", "--host", str(EXAMPLE / "rank0" / "host.json.gz"), "--device",
           str(EXAMPLE / "rank0" / "kineto.json.gz"), "-o", "r0.et"]


def test_convert_shows_its_stages_on_a_terminal_of_zero_columns(tmp_path: Path) -> None:
    rc, out = on_terminal(CONVERT, tmp_path)
    assert rc == 0, out
    for name in ("reading the host ET", "reading the Kineto trace", "inferring dependencies", "writing r0.et"):
        assert f"etweave: {name}" in out
    assert "nodes" in out  # the writer counts nodes


def test_piped_or_quiet_shows_no_progress(tmp_path: Path) -> None:
    done = piped(CONVERT, tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    rc, out = on_terminal([*CONVERT, "--quiet"], tmp_path)
    assert rc == 0 and out == ""


def test_every_command_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    rc, out = on_terminal(["convert-run", str(EXAMPLE), "-o", "out", "--jobs", "1"], tmp_path)
    assert rc == 0 and "etweave: converting ranks" in out and "etweave: cross-rank checks" in out
    rc, out = on_terminal(["simulate", "out"], tmp_path)
    assert rc == 0 and "etweave: loading" in out and "etweave: replaying" in out
    rc, out = on_terminal(["check", "out"], tmp_path)
    assert rc == 0 and "etweave: checking" in out
    rc, out = on_terminal(["jsonize", "out/trace.0.et", "-o", "t.json"], tmp_path)
    assert rc == 0 and "etweave: jsonizing trace.0.et" in out


def test_verbose_times_each_stage_even_when_piped(tmp_path: Path) -> None:
    done = piped([*CONVERT, "-v"], tmp_path)
    assert done.returncode == 0
    lines = done.stderr.splitlines()
    assert any(line.startswith("etweave: reading the Kineto trace: ") and line.endswith(" s") for line in lines)
    assert any(line.startswith("etweave: writing r0.et: ") and line.endswith(" nodes") for line in lines)


def test_common_options_after_every_subcommand() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[attr-defined]
    for name, p in sub.items():
        for option in ("--debug", "-q", "--quiet", "-v", "--verbose"):
            assert option in p._option_string_actions, (name, option)


def test_debug_after_the_subcommand_is_accepted(tmp_path: Path) -> None:
    assert main(["check", str(tmp_path / "missing.et"), "--debug"]) == 2


@pytest.mark.parametrize(("args", "hint"), [
    (["simulat", "x.et"], "did you mean 'simulate'?"),
    (["convert", "--hots", "h.json", "-o", "x.et"], "did you mean --host (for --hots)?"),
    (["jsonize", "x.et", "--format", "chakar"], "did you mean 'chakra'?"),
])
def test_mistyped_words_get_a_suggestion(args: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert hint in capsys.readouterr().err
