"""The top-level Python API (`etweave.convert_pair`, `convert_run`, `simulate_files`), short reprs, and the
per-node / per-step tables (records and CSV, `simulate --csv` / `--steps-csv`) on the bundled real run."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

import etweave
from etweave.cli import main

EXAMPLE = Path(etweave.__file__).parent / "examples" / "gloo_w2"


@pytest.fixture(scope="module")
def run_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("run") / "out"
    return out, etweave.convert_run(EXAMPLE, out, jobs=1)


def test_top_level_names_do_not_shadow_the_modules() -> None:
    import etweave.convert
    import etweave.run
    import etweave.simulate

    assert callable(etweave.convert.convert)  # the documented path keeps working
    assert hasattr(etweave.simulate, "replay") and hasattr(etweave.run, "convert_run")
    assert {"convert_pair", "convert_run", "simulate_files"} <= set(etweave.__all__)
    assert all(callable(getattr(etweave, n)) for n in ("convert_pair", "convert_run", "simulate_files"))
    with pytest.raises(AttributeError):
        etweave.no_such_thing  # noqa: B018


def test_convert_pair_in_memory_and_to_a_file(tmp_path: Path) -> None:
    host, kineto = EXAMPLE / "rank0" / "host.json.gz", EXAMPLE / "rank0" / "kineto.json.gz"
    in_memory = etweave.convert_pair(host, kineto)
    assert list(tmp_path.iterdir()) == []
    written = etweave.convert_pair(str(host), str(kineto), tmp_path / "t.0.et", tmp_path / "r.json")
    assert in_memory.nodes == written.nodes and in_memory.report == written.report
    assert main(["convert", "--host", str(host), "--device", str(kineto), "-o", str(tmp_path / "cli.et"),
                 "--quiet"]) == 0
    assert (tmp_path / "cli.et").read_bytes() == (tmp_path / "t.0.et").read_bytes()
    text = repr(in_memory)
    assert len(text) < 300 and "rank 0" in text and f"{len(in_memory.nodes)} nodes" in text


def test_short_reprs(run_out: tuple[Path, object]) -> None:
    out, run = run_out
    sim = etweave.simulate_files(out)
    for obj in (run, sim, sim.replay):
        assert len(repr(obj)) < 300, repr(obj)
    assert "2 rank(s)" in repr(run) and "consistent" in repr(run)
    assert f"{sim.summary['nodes']} nodes" in repr(sim)


def test_node_table_holds_every_node_and_the_whole_critical_path(run_out: tuple[Path, object]) -> None:
    out, _ = run_out
    sim = etweave.simulate_files(sorted(out.glob("*.et")))
    rows = sim.nodes()
    assert len(rows) == sim.summary["nodes"]
    on_path = sorted((r for r in rows if r["critical_path_order"] is not None), key=lambda r: r["critical_path_order"])
    assert len(on_path) == sim.summary["critical_path"]["nodes"] > 10  # all of it, not the top 10
    assert sum(r["critical_path_us"] for r in on_path) == sim.summary["simulated_makespan_us"]
    assert [(r["rank"], r["id"]) for r in on_path] == [(c["rank"], c["id"]) for c in sim.critical_path()]
    measured = [r for r in rows if r["start_error_us"] is not None]
    assert len(measured) == sim.summary["start_error"]["count"]
    assert max(abs(r["start_error_us"]) for r in measured) == sim.summary["start_error"]["max_us"]
    assert {r["kind"] for r in rows} >= {"host_op", "self_part", "thread_root"}


def test_step_table_matches_the_profiler_steps_kineto_recorded(run_out: tuple[Path, object]) -> None:
    out, _ = run_out
    steps = etweave.simulate_files(out).steps()
    for rank in (0, 1):
        doc = json.loads(gzip.decompress((EXAMPLE / f"rank{rank}" / "kineto.json.gz").read_bytes()))
        recorded = {e["name"]: e["dur"] for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")}
        mine = {r["step"]: r for r in steps if r["rank"] == rank}
        assert set(mine) == set(recorded) and recorded
        for name, dur in recorded.items():
            assert abs(mine[name]["measured_duration_us"] - dur) <= 1, (rank, name)
            assert mine[name]["simulated_duration_us"] is not None


def test_cli_csv_matches_the_records(run_out: tuple[Path, object], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = run_out
    nodes_csv, steps_csv = tmp_path / "nodes.csv", tmp_path / "steps.csv"
    assert main(["simulate", str(out), "--csv", str(nodes_csv), "--steps-csv", str(steps_csv)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote csv {nodes_csv}" in printed and f"wrote steps_csv {steps_csv}" in printed
    sim = etweave.simulate_files(out)
    as_text = [{k: "" if v is None else str(v) for k, v in r.items()} for r in sim.nodes()]
    assert list(csv.DictReader(nodes_csv.open())) == as_text
    assert len(list(csv.DictReader(steps_csv.open()))) == len(sim.steps()) == 4
    api_csv = tmp_path / "api.csv"
    sim.write_csv(api_csv)
    assert api_csv.read_bytes() == nodes_csv.read_bytes()
    sim.write_csv(tmp_path / "cp.csv", "critical_path")
    assert len(list(csv.DictReader((tmp_path / "cp.csv").open()))) == sim.summary["critical_path"]["nodes"]


def test_step_table_of_a_rank_without_profiler_steps(traces: Path, tmp_path: Path) -> None:
    # gpu/linear's host ET has no ProfilerStep op: one row for the whole rank, spanning what was measured
    result = etweave.convert_pair(traces / "gpu/linear/host.json.gz", traces / "gpu/linear/kineto.json.gz",
                                  tmp_path / "t.0.et")
    assert not [n for n in result.nodes if n.name.startswith("ProfilerStep#")]
    sim = etweave.simulate_files(tmp_path / "t.0.et")
    (row,) = sim.steps()
    assert row["step"] == "(no ProfilerStep: whole rank)" and row["id"] is None
    assert row["measured_start_us"] == 0 and row["measured_duration_us"] == sim.summary["measured_span_us"]
    assert row["simulated_duration_us"] > 0
