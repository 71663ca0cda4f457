"""The PNG plots (issue 16 item 4): the per-step breakdown's numbers, checked from the function that returns them,
and the CLI/API options that draw them, on the real 2-rank gloo run bundled with the package."""

from __future__ import annotations

from pathlib import Path

import pytest

import etweave
from etweave.cli import main
from etweave.simulate.breakdown import split

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "out"
    etweave.convert_run(etweave.example_run_dir(), out, jobs=1)
    return out


def test_breakdown_parts_add_up_to_each_step(run_out: Path) -> None:
    sim = etweave.simulate_files(run_out)
    records = sim.breakdown()
    steps = {(r["timeline"], r["rank"], r["step"]) for r in records}
    # the example records ProfilerStep#2 and #3 on both ranks; both timelines are there
    assert {(t, rank, step) for t in ("simulated", "measured") for rank in (0, 1) for step in (2, 3)} <= steps
    for r in records:
        parts = r["compute_only_us"] + r["overlapped_us"] + r["exposed_communication_us"] + r["idle_us"]
        assert parts == r["span_us"], r
        assert 0 <= r["exposed_communication_us"] <= r["communication_us"]
        assert 0 <= r["overlapped_us"] <= min(r["compute_us"], r["communication_us"])
        assert r["idle_us"] >= 0
    # gloo's all_reduce runs on the thread that waits for it: that rank's communication is mostly exposed
    assert any(r["exposed_communication_us"] > 0 for r in records)
    # each step's simulated span is the one the step table reports for that rank
    spans = {(s["rank"], s["step"]): s for s in sim.steps()}
    for r in records:
        if r["timeline"] == "simulated" and (r["rank"], r["step"]) in spans:
            assert r["span_us"] == spans[(r["rank"], r["step"])]["simulated_us"]


def test_split_agrees_with_counting_each_microsecond() -> None:
    compute = [(0, 10), (5, 20), (40, 50), (70, 95)]
    comm = [(15, 45), (60, 80), (90, 120)]
    lo, hi = 3, 100
    got = split(compute, comm, lo, hi)
    inside = {name: {t for s, e in ivs for t in range(max(s, lo), min(e, hi))}
              for name, ivs in (("c", compute), ("m", comm))}
    c, m = inside["c"], inside["m"]
    assert got == {"span_us": hi - lo, "compute_us": len(c), "communication_us": len(m), "overlapped_us": len(c & m),
                   "exposed_communication_us": len(m - c), "idle_us": hi - lo - len(c | m),
                   "compute_only_us": len(c - m)}


def test_cli_draws_the_plot_and_the_breakdown(run_out: Path, tmp_path: Path) -> None:
    plot, parts = tmp_path / "plot.png", tmp_path / "breakdown.png"
    assert main(["simulate", str(run_out), "-q", "--plot", str(plot), "--breakdown", str(parts),
                 "--plot-ranks", "1", "--plot-window", "5:12"]) == 0
    assert plot.read_bytes()[:8] == PNG and parts.read_bytes()[:8] == PNG


@pytest.mark.parametrize("args", [
    ["--plot-ranks", "1"],                                    # nothing to draw them on
    ["--plot", "p.png", "--plot-ranks", "one"],               # not a rank list
    ["--plot", "p.png", "--plot-ranks", "7"],                 # not a rank of the run
    ["--plot", "p.png", "--plot-window", "12:5"],             # START >= END
    ["--plot", "p.png", "--plot-window", "1000:"],            # after the run's end
])
def test_bad_plot_options_are_bad_input(run_out: Path, tmp_path: Path, args: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(tmp_path / a) if a.endswith(".png") else a for a in args]
    assert main(["simulate", str(run_out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("etweave: error: --plot-") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.png").exists()


def test_api_writes_the_breakdown(run_out: Path, tmp_path: Path) -> None:
    sim = etweave.simulate_files(run_out)
    sim.write_breakdown(tmp_path / "b.png", ranks=[0])
    sim.write_plot(tmp_path / "p.png", ranks=[0], window_ms=(None, 10.0))
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG and (tmp_path / "p.png").read_bytes()[:8] == PNG
