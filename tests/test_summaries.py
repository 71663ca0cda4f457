"""Summaries that say what happened (issue 16 item 6), on the real 2-rank gloo run bundled with the package:
rank start offsets, a part of a run simulated or checked, ranks converted one at a time, node counts, --explain."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from etweave.chakra.io import read_et
from etweave.cli import main
from etweave.fidelity import RANK_START_OFFSET

EXAMPLE = Path(__file__).resolve().parents[1] / "etweave" / "examples" / "gloo_w2"


@pytest.fixture(scope="module")
def run_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "out"
    assert main(["convert-run", str(EXAMPLE), "-o", str(out), "-q", "--jobs", "1"]) == 0
    return out


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each rank converted alone with `etweave convert`, as a user might before replaying them together."""
    out = tmp_path_factory.mktemp("alone")
    for rank in (0, 1):
        d = EXAMPLE / f"rank{rank}"
        assert main(["convert", "--host", str(d / "host.json.gz"), "--device", str(d / "kineto.json.gz"),
                     "--rank", str(rank), "-o", str(out / f"trace.{rank}.et"), "-q"]) == 0
    return out


def simulate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    capsys.readouterr()
    assert main(["simulate", *args, "--json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_per_rank_lines_show_the_rank_start_offset(run_out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    offsets = orjson.loads((run_out / "report.json").read_bytes())["rank_start_offsets_micros"]
    assert any(v > 0 for v in offsets.values())  # the example's ranks did start apart
    s = simulate_json(capsys, str(run_out))
    for r in s["per_rank"]:
        assert r["measured_first_start_us"] == offsets[str(r["rank"])]
        # the replay starts the rank where it started (within the few us a root's own work may shift it)
        assert abs(r["simulated_first_start_us"] - offsets[str(r["rank"])]) <= 5
    cp = s["critical_path"]
    assert all(c["name"] != RANK_START_OFFSET for c in cp["top"])
    assert cp["rank_start_offset_us"] in {0, *offsets.values()}
    assert main(["simulate", str(run_out)]) == 0
    text = capsys.readouterr().out
    late = max(offsets, key=lambda k: offsets[k])
    assert f"rank {late}: simulated" in text and f"from +{offsets[late]} us" in text


def test_part_of_a_run_says_who_is_missing(run_out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = simulate_json(capsys, str(run_out / "trace.0.et"))
    assert any(n.startswith("1 member(s) of the world group are missing (rank(s) 1;") for n in s["notes"])
    whole = simulate_json(capsys, str(run_out))
    assert not any("are missing" in n for n in whole["notes"])

    assert main(["check", str(run_out / "trace.1.et")]) == 0
    text = capsys.readouterr().out
    assert "missing-ranks: 1 rank(s) of the run are not among the files given: 0" in text
    assert "clean, but only part of the run" in text
    assert main(["check", str(run_out)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("clean")


def test_ranks_converted_one_at_a_time_are_warned_about(run_out: Path, one_at_a_time: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    alone = simulate_json(capsys, str(one_at_a_time))
    assert len(alone["warnings"]) == 1 and "keep the wait for their slowest peer" in alone["warnings"][0]
    assert "convert-run" in alone["warnings"][0]
    assert simulate_json(capsys, str(run_out))["warnings"] == []
    assert simulate_json(capsys, str(one_at_a_time / "trace.0.et"))["warnings"] == []  # one rank waits for no one


def test_report_counts_the_nodes_the_file_holds(run_out: Path) -> None:
    report = orjson.loads((run_out / "report.json").read_bytes())
    for rank, r in report["ranks"].items():
        assert r["nodes"] == len(read_et(run_out / f"trace.{rank}.et")[1])


def test_explain(run_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = EXAMPLE / "rank0"
    base = ["convert", "--host", str(d / "host.json.gz"), "--device", str(d / "kineto.json.gz"),
            "-o", str(tmp_path / "r0.et"), "-q"]
    assert main([*base, "--explain", "999999"]) == 2
    assert "node 999999 is not in the output" in capsys.readouterr().err

    nodes = read_et(run_out / "trace.1.et")[1]
    node = next(n for n in nodes if len(n.data_deps) >= 2)
    assert main(["convert-run", str(EXAMPLE), "-o", str(tmp_path / "out"), "-q", "--jobs", "1",
                 "--explain", f"1:{node.id}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rank 1 node {node.id} {node.name!r}")
    assert all(f"<- {dep} " in out for dep in node.data_deps)
    assert main(["convert-run", str(EXAMPLE), "-o", str(tmp_path / "out2"), "-q", "--jobs", "1",
                 "--explain", "1:999999"]) == 2
    assert "rank 1 has no node 999999" in capsys.readouterr().err
