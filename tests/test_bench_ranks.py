"""bench.ranks: a synthetic 32-rank run made from gpu/dlrm-8rank, and a 16-rank one made from a gloo run recorded
with etweave.collect (send/recv peers rewritten), convert with consistent cross-rank checks, pass `check`, and
replay with no stuck node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import etweave
from bench.ranks import Repeats, _startup_key, generate, record_gloo, runs_needed, startup_input, startup_run
from bench.scale import load_json
from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs, read_et
from etweave.cli import main
from etweave.read.widths import MAX_RANKS
from etweave.simulate.engine import replay
from etweave.simulate.load import load_comm_group, load_rank
from etweave.simulate.pool import MIN_FILES

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


def _replays_clean(folder: Path) -> None:
    assert main(["check", str(folder)]) == 0
    result = replay([load_rank(p) for p in sorted(folder.glob("trace.*.et"))],
                    load_comm_group(folder / "comm_group.json"))
    assert result.stuck_count == 0


def test_startup_run_holds_every_kind(run32: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The start-up run bench.ranks subtracts: ranks 0 and 1 of the real output, one node of every kind each."""
    _, out, _ = run32
    files = startup_run(out, tmp_path / "startup")
    assert [p.name for p in files] == ["trace.0.et", "trace.1.et"]
    for r, path in enumerate(files):
        cut = read_et(path)[1]
        kinds = {_startup_key(n) for n in read_et(out / f"trace.{r}.et")[1]}
        assert sorted(_startup_key(n) for n in cut) == sorted(kinds)  # every kind once (dlrm: no p2p to drop)
        assert {n.type for n in cut} == {pb.COMP_NODE, pb.COMM_COLL_NODE}
        assert [list(n.data_deps) for n in cut[1:]] == [[n.id] for n in cut[:-1]]  # one chain
    assert load_comm_group(tmp_path / "startup" / "comm_group.json") == {"1": [0, 1]}
    report = json.loads((tmp_path / "startup" / "report.json").read_text())
    assert sorted(report["ranks"]) == ["0", "1"] and "cross_rank" in report
    _replays_clean(tmp_path / "startup")


def _converts_small(run: Path, full: Path, tmp_path: Path) -> None:
    """convert-run's start-up input (`startup_input`) of `run`: ranks 0 and 1 with the same files, converting clean
    with the table's command line into under 10% of each rank's nodes in the real output `full` (dlrm 3%, gloo 5%)."""
    cut = startup_input(run, tmp_path / "cut")
    assert sorted(p.relative_to(cut).as_posix() for p in cut.rglob("*.gz")) == sorted(
        p.relative_to(run).as_posix() for p in run.rglob("*.gz") if p.parent.name in ("rank0", "rank1"))
    out = tmp_path / "out"
    assert main(["convert-run", str(cut), "-o", str(out), "--quiet", "--jobs", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["cross_rank"]["consistent"]
    for r in (0, 1):
        nodes = report["ranks"][str(r)]["nodes"]
        assert 0 < nodes < 0.1 * len(read_et(full / f"trace.{r}.et")[1])
        assert report["ranks"][str(r)]["host_ops"]["output"] > 0  # both files read and linked: the same shape


def test_startup_input_converts_small(run32: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run, out, _ = run32
    _converts_small(run, out, tmp_path)


def test_runs_needed() -> None:
    assert runs_needed(0.5, Repeats(10, 25)) == 20  # a 0.5 s run: 20 runs make the 10 s
    assert runs_needed(0.3, Repeats(10, 25)) == 25 and runs_needed(0.0, Repeats(10, 25)) == 25  # capped
    assert runs_needed(4.0, Repeats(10, 25)) == 3
    assert runs_needed(30.0, Repeats(10, 25)) == 1
    assert runs_needed(30.0, Repeats(10, 25, fewest=2)) == 2 and runs_needed(4.0, Repeats(10, 25, fewest=2)) == 3


# ---- the gloo source: a CPU run recorded with etweave.collect, with send/recv

GLOO_N = 16


@pytest.fixture(scope="module")
def gloo16(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the recorded 2-rank source, the 16-rank run made from it, its convert-run output)."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("gloo")
    src = record_gloo(base / "src")
    run = generate(GLOO_N, base / "run", src, source="gloo")
    out = base / "out"
    assert main(["convert-run", str(run), "-o", str(out), "--jobs", "2", "--quiet"]) == 0
    return src, run, out


def p2p(nodes: list[pb.Node]) -> list[tuple[str, int, int, int, int]]:
    """(send/recv, src, dst, tag, size) of a rank's p2p nodes, in issue order (ascending id)."""
    found = []
    for n in sorted(nodes, key=lambda n: n.id):
        if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            a = node_attrs(n)
            fields = [a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]]
            assert all(isinstance(v, int) for v in fields)
            src, dst, tag, size = (v for v in fields if isinstance(v, int))
            found.append(("send" if n.type == pb.COMM_SEND_NODE else "recv", src, dst, tag, size))
    return found


def test_gloo_source_peers_rewritten_and_checks_pass(gloo16: tuple[Path, Path, Path]) -> None:
    _, run, out = gloo16
    info = load_json(run / "rank13" / "kineto.json.gz")["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (13, GLOO_N)
    cross = json.loads((out / "report.json").read_text())["cross_rank"]
    assert cross["consistent"] and not cross["violations"] and not cross["mismatches"]
    (world,) = cross["groups"]
    assert world["group"] == "" and world["present"] == f"0-{GLOO_N - 1}" and world["absent"] == 0
    ranks = {r: read_et(out / f"trace.{r}.et")[1] for r in range(GLOO_N)}
    for r, nodes in ranks.items():
        peer = r ^ 1  # the source's pair (0, 1), copied per block of 2
        mine = p2p(nodes)
        assert mine and {(src, dst) for _, src, dst, _, _ in mine} == {(r, peer), (peer, r)}, (r, mine)
        # each send of r is a recv of its peer, in the same order
        sends = [m[1:] for m in mine if m[0] == "send"]
        assert sends == [m[1:] for m in p2p(ranks[peer]) if m[0] == "recv"]


def test_gloo_source_check_and_simulate(gloo16: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, _, out = gloo16
    assert main(["check", str(out)]) == 0
    assert main(["simulate", str(out)]) == 0
    assert "deadlock" not in capsys.readouterr().out
    result = replay([load_rank(p) for p in sorted(out.glob("trace.*.et"))], load_comm_group(out / "comm_group.json"))
    assert result.stuck_count == 0


def test_gloo_source_bounds(gloo16: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src = gloo16[0]
    for bad in (0, 3, MAX_RANKS + 2):  # 3: not a multiple of the source's 2 ranks (a peer would be missing)
        with pytest.raises(SystemExit):
            generate(bad, tmp_path / "bad", src, source="gloo")


def test_gloo_startup_input_converts_small(gloo16: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, run, out = gloo16
    _converts_small(run, out, tmp_path)


def test_gloo_startup_run_pairs_send_and_recv(gloo16: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, _, out = gloo16
    startup_run(out, tmp_path / "startup")
    ranks = {r: read_et(tmp_path / "startup" / f"trace.{r}.et")[1] for r in (0, 1)}
    sends = [m[1:] for r in (0, 1) for m in p2p(ranks[r]) if m[0] == "send"]
    recvs = [m[1:] for r in (0, 1) for m in p2p(ranks[r]) if m[0] == "recv"]
    assert sends and sorted(sends) == sorted(recvs)  # each kept send beside its recv
    assert any(n.name == "## process_group:init ##" for n in ranks[0])
    _replays_clean(tmp_path / "startup")


def test_loading_in_workers_gives_what_loading_here_gives(run32: tuple[Path, Path, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """simulate's loading pool (etweave.simulate.pool): the ranks decoded from the workers equal the ranks read in
    this process, their strings interned again, and both models print the same with --jobs 1 and --jobs 3."""
    from etweave.simulate.astra import AstraRank, load_astra_rank, load_for_astra
    from etweave.simulate.load import load_ranks

    _, out, _ = run32
    files = sorted(out.glob("trace.*.et"))
    assert len(files) >= MIN_FILES
    here, pooled = load_ranks(files, jobs=1), load_ranks(files, jobs=3)
    assert pooled == here
    assert all(a.name is b.name and a.kind is b.kind
               for ra, rb in zip(here, pooled, strict=True) for a, b in zip(ra.nodes, rb.nodes, strict=True))
    astra_here, astra_pooled = load_for_astra(files, jobs=1), load_for_astra(files, jobs=2)
    assert astra_pooled == astra_here and isinstance(astra_pooled[1], AstraRank)
    assert astra_pooled[1] == load_astra_rank(files[1])  # a worker's file
    for model in ([], ["--model", "astra-sim"]):
        printed = []
        for jobs in ("1", "3"):
            assert main(["simulate", str(out), "--jobs", jobs, *model]) == 0
            printed.append(capsys.readouterr().out)
        assert printed[0] == printed[1] and printed[0]
    api_here, api_pooled = (etweave.simulate_files(out, jobs=jobs) for jobs in (1, 2))  # the Python API alike
    assert api_pooled.summary == api_here.summary and api_here.summary["nodes"] > 0
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        etweave.simulate_files(out, jobs=0)


@pytest.mark.parametrize(("bad", "named"), [((5, 8), 5), ((8, 13), 8), ((31,), 31)])
def test_loading_in_workers_names_the_first_bad_file(run32: tuple[Path, Path, Path], tmp_path: Path,
                                                     bad: tuple[int, ...], named: int) -> None:
    """A bad file read by a worker or by this process: the error is the first bad file's in file order, as reading
    the files one after the other would meet it (with --jobs 2 this process reads the even places)."""
    from etweave.errors import BadInput
    from etweave.simulate.load import load_ranks

    _, out, _ = run32
    files = []
    for i, src in enumerate(sorted(out.glob("trace.*.et"), key=lambda p: int(p.name.split(".")[1]))):
        dst = tmp_path / src.name
        dst.write_bytes(b"\xff\xff\xff\xff not a node" if i in bad else src.read_bytes())
        files.append(dst)
    for jobs in (1, 2):
        with pytest.raises(BadInput) as caught:
            load_ranks(files, jobs=jobs)
        assert caught.value.where == str(files[named])


def test_simulate_refuses_no_jobs(run32: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run32
    assert main(["simulate", str(out), "--jobs", "0"]) == 2
    assert "--jobs: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("job", ["run32", "gloo16"])
def test_replays_rank_by_rank_as_in_one_global_order(job: str, request: pytest.FixtureRequest) -> None:
    """Both replays of a synthetic run (collectives of the world and of subgroups; the gloo one's sends and recvs)
    replay rank by rank all through (etweave.simulate.byrank), with what one global order gives."""
    from etweave.simulate.astra import load_for_astra, simulate_timings
    from etweave.simulate.load import load_ranks
    from etweave.simulate.network import DEFAULT_NETWORK

    out = request.getfixturevalue(job)[2 if job == "gloo16" else 1]
    files = sorted(out.glob("trace.*.et"), key=lambda p: int(p.name.split(".")[1]))
    groups = load_comm_group(out / "comm_group.json")
    ranks = load_ranks(files)
    by_rank, in_order = replay(ranks, groups), replay(ranks, groups, by_rank=False)
    assert by_rank.by_rank and not in_order.by_rank
    assert (by_rank.start, by_rank.end, by_rank.critical_path) == (in_order.start, in_order.end,
                                                                   in_order.critical_path)
    astra = load_for_astra(files)
    for timing in ("network", "duration"):
        runs = [simulate_timings(astra, groups, DEFAULT_NETWORK, (timing,), contention=True, by_rank=b)[0]
                for b in (True, False)]
        assert runs[0].by_rank and not runs[1].by_rank
        assert (runs[0].finished_ns, runs[0].slot_wait_ns, runs[0].blocked_by) == (
            runs[1].finished_ns, runs[1].slot_wait_ns, runs[1].blocked_by)
