"""`etweave simulate` on what etweave writes for the real traces: every pair alone, dlrm's 8 ranks together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PAIRS, convert_pair

from etweave.chakra.io import write_et
from etweave.cli import main


@pytest.mark.parametrize("rel", PAIRS)
def test_simulate_every_pair(traces: Path, rel: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = convert_pair(traces, rel)
    path = tmp_path / f"trace.{result.report['rank']}.et"  # a file's name gives its rank (etweave.runfolder)
    write_et(path, result.metadata, result.nodes)
    assert main(["simulate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"] and out["nodes"] == len(result.nodes)
    # one rank alone: threads and streams as resources, so within a few % of the measured run
    assert abs(out["makespan_error_pct"]) <= 5.0, out["makespan_error_pct"]
    assert out["critical_path"]


def test_simulate_dlrm_eight_ranks_together(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "dlrm"
    assert main(["convert-run", str(traces / "gpu/dlrm-8rank"), "-o", str(out_dir), "--jobs", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["simulate", str(out_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == list(range(8))
    assert out["collectives"]["count"] == 8, "8 collectives, each matched across the 8 ranks"
    assert out["collectives"]["start_error"]["max_us"] < 500
    # ranks start where they started (rank start offsets) and collectives wait for the latest arrival
    assert abs(out["makespan_error_pct"]) <= 2.0, out["makespan_error_pct"]
    report = json.loads((out_dir / "report.json").read_text())
    assert max(report["rank_start_offsets_micros"].values()) > 5000
