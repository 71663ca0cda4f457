"""bench.ranks: a synthetic 32-rank run made from gpu/dlrm-8rank converts with consistent cross-rank checks,
passes `check`, and replays with no stuck node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.ranks import MAX_RANKS, generate
from bench.scale import load_json
from etweave.cli import main
from etweave.simulate.engine import replay
from etweave.simulate.load import load_comm_group, load_rank

N, GROUP = 32, 4


@pytest.fixture(scope="module")
def run32(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(synthetic run folder, its convert-run output, the 8-rank source's convert-run output)."""
    base = tmp_path_factory.mktemp("ranks")
    run = generate(N, base / "run", traces / "gpu" / "dlrm-8rank")
    out, src_out = base / "out", base / "src"
    assert main(["convert-run", str(run), "-o", str(out), "--jobs", "2", "--quiet"]) == 0
    assert main(["convert-run", str(traces / "gpu" / "dlrm-8rank"), "-o", str(src_out), "--jobs", "2",
                 "--quiet"]) == 0
    return run, out, src_out


def test_ranks_world_and_subgroups(run32: tuple[Path, Path, Path]) -> None:
    run, out, _ = run32
    info = load_json(run / "rank13" / "kineto.json.gz")["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (13, N)
    assert [g["ranks"] for g in info["pg_config"]] == [list(range(N)), [12, 13, 14, 15]]
    groups = load_comm_group(out / "comm_group.json")
    assert sorted(groups.values()) == [list(range(lo, lo + GROUP)) for lo in range(0, N, GROUP)]


def test_cross_rank_checks_pass(run32: tuple[Path, Path, Path]) -> None:
    _, out, _ = run32
    report = json.loads((out / "report.json").read_text())
    cross = report["cross_rank"]
    assert cross["consistent"] and not cross["violations"] and not cross["mismatches"]
    by_group = {g["group"]: g for g in cross["groups"]}
    assert set(by_group) == {""} | {str(1 + i) for i in range(N // GROUP)}
    # the world group runs dlrm's 5 all-to-alls on all 32 ranks, each subgroup its 3 all-reduces
    assert set(by_group[""]["collectives_per_rank"].values()) == {5}
    assert len(by_group[""]["collectives_per_rank"]) == N
    for gid in set(by_group) - {""}:
        assert set(by_group[gid]["collectives_per_rank"].values()) == {3}
        assert by_group[gid]["matched"] == 3


def test_node_counts_near_the_source_rank(run32: tuple[Path, Path, Path]) -> None:
    _, out, src_out = run32
    ranks = json.loads((out / "report.json").read_text())["ranks"]
    source = json.loads((src_out / "report.json").read_text())["ranks"]
    assert len(ranks) == N
    for r in range(N):
        mine, theirs = ranks[str(r)]["nodes"], source[str(r % 8)]["nodes"]
        assert abs(mine - theirs) <= 0.1 * theirs, (r, mine, theirs)


def test_check_and_simulate(run32: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run32
    assert main(["check", str(out)]) == 0
    assert main(["simulate", str(out)]) == 0  # exits 3 on a stuck node
    assert "deadlock" not in capsys.readouterr().out
    graphs = [load_rank(p) for p in sorted(out.glob("trace.*.et"))]
    result = replay(graphs, load_comm_group(out / "comm_group.json"))
    assert result.stuck_count == 0
    assert all(t >= 0 for ends in result.end for t in ends)
    assert len(result.collectives) == 5 + 3 * (N // GROUP)


def test_same_seed_same_bytes_and_bounds(traces: Path, tmp_path: Path) -> None:
    a = generate(9, tmp_path / "a", traces / "gpu" / "dlrm-8rank", seed=7)
    b = generate(9, tmp_path / "b", traces / "gpu" / "dlrm-8rank", seed=7)
    for r in range(9):
        assert (a / f"rank{r}" / "kineto.json.gz").read_bytes() == (b / f"rank{r}" / "kineto.json.gz").read_bytes()
    # ranks 0 and 8 are copies of source rank 0 with different shifts and stretches: same events, other times
    k0 = load_json(a / "rank0" / "kineto.json.gz")["traceEvents"]
    k8 = load_json(a / "rank8" / "kineto.json.gz")["traceEvents"]
    assert [e["name"] for e in k0] == [e["name"] for e in k8]
    assert [e.get("ts") for e in k0] != [e.get("ts") for e in k8]
    for bad in (0, MAX_RANKS + 1):
        with pytest.raises(SystemExit):
            generate(bad, tmp_path / "bad")
