"""progress.py: stages show nothing off a terminal, and --verbose prints each stage's name and time at its end."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from etweave import progress


@pytest.fixture(autouse=True)
def _off_after() -> Iterator[None]:
    yield
    progress.configure(False)


def test_counted_passes_items_through_and_counts_them(capsys: pytest.CaptureFixture[str]) -> None:
    progress.configure(True, verbose=True)
    assert list(progress.counted(iter(range(10)), "reading", chunk=3, unit="events")) == list(range(10))
    err = capsys.readouterr().err
    assert re.fullmatch(r"etweave: reading: \d+\.\d s, 10 events\n", err)


def test_quiet_and_muted_print_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    progress.configure(False, verbose=True)  # --quiet wins over --verbose
    with progress.stage("linking") as s:
        s.advance(5)
    progress.configure(True, verbose=True)
    with progress.muted(), progress.stage("inferring"):
        assert not progress.shown()
    assert capsys.readouterr().err == ""


def test_no_bar_off_a_terminal() -> None:
    progress.configure(True)
    assert not progress.shown()  # pytest's stderr is no terminal
    with progress.stage("writing", total=3) as s:
        s.advance(3)
        assert s._bar is None
