"""bench.stage_memory: a line per step of one conversion, in the order `etweave convert` runs them."""

from __future__ import annotations

import re
import tracemalloc

import pytest

from bench.scale import traces_dir
from bench.stage_memory import main
from etweave.convert import STAGES


@pytest.mark.parametrize("traced", [False, True])
def test_a_line_per_step_in_order(capsys: pytest.CaptureFixture[str], traced: bool) -> None:
    trace = traces_dir() / "kineto-only" / "sendrecv-rank0.json.gz"
    assert main(["--device", str(trace), "--top", "2", *(["--traced"] if traced else [])]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = [line.split()[0] for line in lines if re.search(r"peak +\d+ MB  rss +\d+ MB$", line)]
    assert steps == ["start", "read", *(s.name for s in STAGES), "encoded", "self-checked"]
    assert any(line.strip().startswith("traced ") for line in lines) == traced
    assert not tracemalloc.is_tracing()
