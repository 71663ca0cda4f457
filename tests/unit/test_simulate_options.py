"""etweave simulate's option checks, all in `simulate_cmd.check_options`: made before any file is loaded."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from etweave.cli import build_parser
from etweave.commands.simulate_cmd import check_options
from etweave.errors import BadInput
from etweave.renderers import CsvRenderer, TimelineRenderer


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["simulate", *argv])


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.0.et"
    path.write_bytes(b"")  # never read: the checks come first
    return path


def test_outputs_gathered_in_the_order_json_lists_them(trace: Path, tmp_path: Path) -> None:
    options = check_options(parsed(str(trace), "--steps-csv", str(tmp_path / "s.csv"),
                                   "--timeline", str(tmp_path / "t.json"), "--csv", str(tmp_path / "n.csv")))
    assert list(options.outputs) == ["timeline", "csv", "steps_csv"]
    assert options.outputs["steps_csv"] == (tmp_path / "s.csv", CsvRenderer("steps"))
    assert options.outputs["csv"][1] == CsvRenderer("nodes")
    assert isinstance(options.outputs["timeline"][1], TimelineRenderer)
    assert options.files == [trace] and options.edits == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--npus", "0"], "--npus: only read with --model astra-sim"),
    (["--unlimited-slots"], "--unlimited-slots: only read with --model astra-sim"),
    (["--model", "astra-sim", "--steps-csv", "x.csv"], "--steps-csv: not available with --model astra-sim"),
    (["--model", "astra-sim", "--npus", "1"], "--npus: ASTRA-sim's analytical network refuses fewer than 2 NPUs"),
    (["--model", "astra-sim", "--npus", "1048577"],
     "--npus: 1048577 NPUs: at most 1048576, the largest world size etweave reads"),
    (["--model", "astra-sim", "--scale", "kind=gpu:2"], "what-if edits .* apply to the default model only"),
    (["--plot-window", "1:2"], "--plot-ranks and --plot-window choose what --plot/--breakdown draw"),
    (["--scale", "nonsense"], "expected SELECTOR:NUMBER"),
])
def test_refused_options(trace: Path, argv: list[str], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        check_options(parsed(str(trace), *argv))


def test_an_output_that_is_an_input_is_refused(trace: Path) -> None:
    with pytest.raises(BadInput, match="--timeline is also an input"):
        check_options(parsed(str(trace), "--timeline", str(trace)))
    assert trace.read_bytes() == b""
