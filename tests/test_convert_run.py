"""`etweave convert-run`: whole runs to .et files + comm_group.json + report.json, with cross-rank checks."""

from __future__ import annotations

import contextlib
import gzip
import shutil
from pathlib import Path

import orjson
import pytest
from conftest import load_gz, write_gz

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs, read_et, serialize
from etweave.cli import main
from etweave.errors import BadInput
from etweave.process_groups import GroupDescription, GroupSource
from etweave.run import CollSig, ConvertedRank, assemble_run, build_comm_group, check_sequences, discover

RUNS = {"gpu/dlrm-8rank": 8, "cpu-gloo/dist_ddp_w2": 2, "cpu-gloo/dist_fsdp1_w2": 2}


def convert_run(run_dir: Path, out: Path, *extra: str) -> int:
    return main(["convert-run", str(run_dir), "-o", str(out), *extra])


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):  # the shared traces are read-only; the copies are edited
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def files_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def dlrm_out(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """gpu/dlrm-8rank converted once through the process pool (several tests read it), and its stdout."""
    base = tmp_path_factory.mktemp("dlrm")
    out, capture = base / "out", base / "stdout.txt"
    with capture.open("w") as f, contextlib.redirect_stdout(f):
        assert convert_run(traces / "gpu/dlrm-8rank", out, "--jobs", "2") == 0
    return out, capture.read_text()


@pytest.mark.parametrize("rel", list(RUNS))
def test_run_converts_and_checks(traces: Path, tmp_path: Path, rel: str, capsys: pytest.CaptureFixture[str],
                                 request: pytest.FixtureRequest) -> None:
    if rel == "gpu/dlrm-8rank":
        out, stdout = request.getfixturevalue("dlrm_out")
    else:
        out = tmp_path / "out"
        assert convert_run(traces / rel, out, "--jobs", "2") == 0
        stdout = capsys.readouterr().out
    n = RUNS[rel]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"trace.{r}.et" for r in range(n)] + ["comm_group.json", "report.json"])
    assert f"cross-rank check: {n} rank(s), consistent" in stdout
    assert main(["check", str(out)]) == 0

    report = orjson.loads((out / "report.json").read_bytes())
    comm_group = orjson.loads((out / "comm_group.json").read_bytes())
    assert sorted(report["ranks"]) == [str(r) for r in range(n)]
    cross = report["cross_rank"]
    assert cross["consistent"] and not cross["mismatches"] and not cross["violations"]
    [world] = [g for g in cross["groups"] if g["group"] == ""]
    assert world["members"] == n and world["absent"] == 0 and world["divergences"] == []
    counts = set(world["collectives_per_rank"].values())
    assert len(counts) == 1 and counts.pop() > 0

    transfer_nodes = 0
    for r in range(n):
        _, nodes = read_et(out / f"trace.{r}.et")
        for node in nodes:
            if node.type not in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                continue
            a = node_attrs(node)
            assert a["pg_name"] == "" or a["pg_name"] in comm_group
            if "transfer_duration_micros" in a:
                transfer_nodes += 1
                assert node.type == pb.COMM_COLL_NODE
                assert a["transfer_duration_micros"] == node.duration_micros
                assert 0 <= node.duration_micros <= a["measured_duration_micros"]  # type: ignore[operator]
    d = report["durations"]
    assert transfer_nodes == d["comm_nodes_matched"] > 0
    assert d["adjusted"] > 0


def test_dlrm_durations_lose_the_wait(dlrm_out: tuple[Path, str]) -> None:
    # FORMATS.md: dlrm collectives end together but start up to 7.6 ms apart; the transfer is what remains.
    out = dlrm_out[0]
    report = orjson.loads((out / "report.json").read_bytes())
    assert report["durations"]["max_adjustment_micros"] > 7000
    by_seq: dict[int, list[tuple[int, int, int]]] = {}
    for r in range(8):
        _, nodes = read_et(out / f"trace.{r}.et")
        for node in nodes:
            if node.type == pb.COMM_COLL_NODE:
                a = node_attrs(node)
                by_seq.setdefault(int(a["comm_seq"]), []).append(  # type: ignore[arg-type]
                    (node.start_time_micros, int(a["measured_duration_micros"]), node.duration_micros))  # type: ignore[arg-type]
    assert len(by_seq) == 8 and all(len(v) == 8 for v in by_seq.values())
    for members in by_seq.values():
        latest = max(start for start, _, _ in members)
        for start, measured, transfer in members:
            assert transfer == max(1, start + measured - latest)


def drop_nccl_kernel(kineto: Path, prefix: str) -> None:
    """Remove the first GPU kernel whose name starts with `prefix` from a Kineto trace."""
    doc = load_gz(kineto)
    events = doc["traceEvents"]
    i = next(i for i, ev in enumerate(events) if ev.get("cat") == "kernel" and ev.get("name", "").startswith(prefix))
    del events[i]
    write_gz(kineto, doc)


def test_inconsistent_rank_is_named(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(traces / "gpu/dlrm-8rank", tmp_path / "run")
    # rank 3 loses its first all-reduce (the 5th collective: four all_to_alls come first)
    drop_nccl_kernel(run / "rank3" / "kineto.json.gz", "ncclKernel_AllReduce")
    out = tmp_path / "out"
    assert convert_run(run, out) == 3
    captured = capsys.readouterr()
    assert "rank 3 diverges at collective index 4" in captured.err
    assert "rank 3 diverges at collective index 4" in captured.out
    assert "ranks 0-2,4-7" in captured.out or "rank(s) 0-2,4-7" in captured.out
    assert not out.exists(), "a failed run writes nothing"

    assert convert_run(run, out, "--allow-mismatch") == 0
    report = orjson.loads((out / "report.json").read_bytes())
    cross = report["cross_rank"]
    assert cross["consistent"] is False and cross["allow_mismatch"] is True
    [world] = [g for g in cross["groups"] if g["group"] == ""]
    [d] = world["divergences"]
    assert d["rank"] == 3 and d["index"] == 4 and d["expected_on"] == [0, 1, 2, 4, 5, 6, 7]
    assert world["matched"] == 4  # durations adjusted only where all members agree
    assert {v["rule"] for v in cross["mismatches"]} == {"coll-mismatch"}
    assert "NOT consistent" in capsys.readouterr().out


def test_dask_cluster_output_is_byte_identical(traces: Path, tmp_path: Path, dlrm_out: tuple[Path, str]) -> None:
    from dask.distributed import LocalCluster

    run = traces / "gpu/dlrm-8rank"
    local, remote = dlrm_out[0], tmp_path / "dask"
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
        assert convert_run(run, remote, "--scheduler", cluster.scheduler_address, "--quiet") == 0
    assert files_of(local) == files_of(remote)
    serial = tmp_path / "serial"
    assert convert_run(run, serial, "--jobs", "1", "--quiet") == 0
    assert files_of(local) == files_of(serial)


def test_failed_run_writes_nothing(traces: Path, tmp_path: Path) -> None:
    run = copy_run(traces / "cpu-gloo/dist_fsdp1_w2", tmp_path / "run")
    host = run / "rank1" / "host.json.gz"
    data = gzip.decompress(host.read_bytes())
    host.write_bytes(gzip.compress(data[: len(data) // 2]))  # truncated mid-file
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("not ours")
    assert convert_run(run, out) == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert convert_run(run, out, "--jobs", "1") == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_partial_run_reports_absent_members(traces: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # two of dlrm's eight ranks: the world size comes from Kineto distributedInfo
    run = tmp_path / "run"
    for r in (2, 5):
        copy_run(traces / f"gpu/dlrm-8rank/rank{r}", run / f"rank{r}")
    out = tmp_path / "out"
    assert convert_run(run, out, "--jobs", "1") == 0
    stdout = capsys.readouterr().out
    assert "6 members of the world group are absent" in stdout
    assert "cross-rank check: 2 rank(s), consistent" in stdout
    report = orjson.loads((out / "report.json").read_bytes())
    assert sorted(report["ranks"]) == ["2", "5"]
    assert sorted(p.name for p in out.glob("*.et")) == ["trace.2.et", "trace.5.et"]
    [world] = report["cross_rank"]["groups"]
    assert (world["members"], world["absent"], world["present"]) == (8, 6, "2,5")
    assert any("6 members of the world group are absent" in n for n in report["notes"])
    assert main(["check", str(out)]) == 0


# ---------------------------------------------------------------------------------------------- discovery


def test_discovery_rank_folders(traces: Path) -> None:
    found = discover(traces / "gpu/dlrm-8rank")
    assert [rf.rank for rf in found.ranks] == list(range(8))
    assert all(rf.host is not None and rf.host.name == "host.json.gz" for rf in found.ranks)
    assert all(rf.kineto is not None and rf.kineto.name == "kineto.json.gz" for rf in found.ranks)


def test_discovery_flat_files_by_content(traces: Path, tmp_path: Path) -> None:
    src = traces / "cpu-gloo/dist_fsdp1_w2"
    # names that do not say which trace is which: the content does
    for r in range(2):
        shutil.copy(src / f"rank{r}" / "host.json.gz", tmp_path / f"a_{r}.json.gz")
        (tmp_path / f"trace-rank{r}.json").write_bytes(gzip.decompress((src / f"rank{r}" / "kineto.json.gz")
                                                                       .read_bytes()))
    (tmp_path / "notes_0.json").write_text('{"comment": "not a trace"}')
    found = discover(tmp_path)
    assert [(rf.rank, rf.host.name if rf.host else None, rf.kineto.name if rf.kineto else None)
            for rf in found.ranks] == [(0, "a_0.json.gz", "trace-rank0.json"), (1, "a_1.json.gz", "trace-rank1.json")]
    assert found.ignored == [str(tmp_path / "notes_0.json")]
    out = tmp_path / "out"
    assert convert_run(tmp_path, out, "--quiet") == 0
    assert main(["check", str(out)]) == 0


def test_discovery_bad_folders(traces: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInput, match="no ranks found"):
        discover(empty)
    assert convert_run(empty, tmp_path / "out") == 2

    two = tmp_path / "two"
    (two / "rank0").mkdir(parents=True)
    host = traces / "cpu-gloo/dist_fsdp1_w2/rank0/host.json.gz"
    shutil.copy(host, two / "rank0" / "host.json.gz")
    shutil.copy(host, two / "rank0" / "host_again.json.gz")
    with pytest.raises(BadInput, match="rank 0 has two host execution traces"):
        discover(two)

    blank = tmp_path / "blank"
    (blank / "rank0").mkdir(parents=True)
    (blank / "rank0" / "host.json").write_bytes(b"")
    with pytest.raises(BadInput, match="empty"):
        discover(blank)


def test_kineto_only_rank(traces: Path, tmp_path: Path) -> None:
    # a rank with only its Kineto trace is converted from that alone
    run = tmp_path / "run"
    for r in range(2):
        (run / f"rank{r}").mkdir(parents=True)
        shutil.copy(traces / f"cpu-gloo/dist_fsdp1_w2/rank{r}/kineto.json.gz", run / f"rank{r}" / "kineto.json.gz")
    shutil.copy(traces / "cpu-gloo/dist_fsdp1_w2/rank0/host.json.gz", run / "rank0" / "host.json.gz")
    found = discover(run)
    assert [(rf.rank, rf.host is not None, rf.kineto is not None) for rf in found.ranks] == [
        (0, True, True), (1, False, True)]


# ---------------------------------------------------------------------------------------------- cross-rank pieces


def sig(node: int, kind: int, size: int, seq: int | None = None) -> CollSig:
    return CollSig(node=node, name=pb.CollectiveCommType.Name(kind).lower(), kind=kind, size=size, seq=seq,
                   start=100, end=200)


def test_sequences_sizes_matter_only_where_required() -> None:
    a2a = {r: [sig(1, pb.ALL_TO_ALL, 10 * (r + 1)), sig(2, pb.ALL_REDUCE, 64)] for r in range(3)}
    assert check_sequences(a2a) == ([], 2)  # all_to_all sizes legitimately differ
    bad = {r: [sig(1, pb.ALL_TO_ALL, 8), sig(2, pb.ALL_REDUCE, 64 if r != 2 else 32)] for r in range(3)}
    divergences, matched = check_sequences(bad)
    assert matched == 1
    assert [(d["rank"], d["index"], d["expected_on"]) for d in divergences] == [(2, 1, [0, 1])]
    seq = {0: [sig(1, pb.ALL_REDUCE, 4, seq=7)], 1: [sig(1, pb.ALL_REDUCE, 4, seq=8)]}
    [d] = check_sequences(seq)[0]
    assert d["rank"] == 1 and "seq 8" in d["has"]  # a tie goes to the lowest rank
    extra = {r: [sig(1, pb.ALL_REDUCE, 4)] for r in range(3)}
    extra[2].append(sig(2, pb.BROADCAST, 4))
    divergences, matched = check_sequences(extra)
    assert matched == 1
    [d] = divergences
    assert (d["rank"], d["index"]) == (2, 1) and "sequences end" in d["expected"] and "BROADCAST" in d["has"]


def out_with_groups(rank: int, groups: list[GroupDescription]) -> ConvertedRank:
    return ConvertedRank(rank=rank, et=b"", report={}, local_groups={}, groups=tuple(groups), world_size=None,
                         trace_rank=None)


def desc(name: str, ranks: list[int], source: GroupSource = GroupSource.HOST) -> GroupDescription:
    return GroupDescription(name, tuple(ranks), len(ranks), source)


def test_comm_group_ids_are_run_wide() -> None:
    # hash-named groups get the same decimal id whichever rank describes them; the world group is ""
    g_a = desc("9f2c", [0, 1])
    g_b = desc("77aa", [2, 3])
    world = GroupDescription("0", (), 4, GroupSource.HOST)
    outputs = [out_with_groups(0, [world, g_a, g_b]), out_with_groups(3, [world, g_b, g_a])]
    groups = build_comm_group(outputs, 4)
    assert groups.ids == {"0": "", "9f2c": "1", "77aa": "2"}  # ids from 1: ASTRA-sim asserts a group id > 0
    assert groups.members == {"1": [0, 1], "2": [2, 3]}
    assert groups.notes == ()
    numbered = [out_with_groups(0, [desc("5", [1, 2], GroupSource.PG_CONFIG),
                                    desc("x", [0, 3], GroupSource.EVENT_ARGS)])]
    groups = build_comm_group(numbered, 4)
    assert groups.ids == {"5": "5", "x": "1"} and groups.members == {"1": [0, 3], "5": [1, 2]}
    # a subgroup the trace calls "0" (not the world group) cannot keep that name
    zero = [out_with_groups(0, [desc("0", [1, 2], GroupSource.PG_CONFIG), desc("1", [0, 3], GroupSource.PG_CONFIG)])]
    groups = build_comm_group(zero, 4)
    assert groups.ids == {"1": "1", "0": "2"} and groups.members == {"1": [0, 3], "2": [1, 2]}


def comm_node(nid: int, pg: str, start: int, measured: int, name: str = "allreduce") -> pb.Node:
    node = pb.Node(id=nid, name=f"nccl:{name}", type=pb.COMM_COLL_NODE, data_deps=[1], start_time_micros=start,
                   duration_micros=measured)
    for attr in (pb.AttributeProto(name="is_cpu_op", bool_val=False),
                 pb.AttributeProto(name="device", int64_val=0), pb.AttributeProto(name="stream", int64_val=7),
                 pb.AttributeProto(name="collective_name", string_val=name),
                 pb.AttributeProto(name="comm_type", int64_val=pb.ALL_REDUCE),
                 pb.AttributeProto(name="comm_size", int64_val=64), pb.AttributeProto(name="pg_name", string_val=pg),
                 pb.AttributeProto(name="measured_duration_micros", int64_val=measured)):
        node.attr.append(attr)
    return node


def fake_rank(rank: int, local_sub: str, start: int, measured: int) -> ConvertedRank:
    """A converted rank as convert_rank returns it: one collective in a hash-named subgroup, numbered locally."""
    root = pb.Node(id=1, name="root", type=pb.COMP_NODE)
    root.attr.extend([pb.AttributeProto(name="kind", string_val="process_root"),
                      pb.AttributeProto(name="num_ops", int64_val=0),
                      pb.AttributeProto(name="tensor_size", uint64_val=0)])
    nodes = [root, comm_node(2, local_sub, start, measured)]
    metadata = pb.GlobalMetadata(version="0.0.4")
    groups = (GroupDescription("w", (), 4, GroupSource.HOST), desc("c0ffee", [0, 1]))
    return ConvertedRank(rank=rank, et=serialize(metadata, nodes), report={}, groups=groups,
                         local_groups={"w": "", "c0ffee": local_sub}, world_size=4, trace_rank=rank)


def test_pg_name_is_one_id_on_every_rank() -> None:
    # the per-rank converter numbered the same group 2 on rank 0 and 1 on rank 1; the run gives it one id
    result = assemble_run([fake_rank(0, "2", start=100, measured=50), fake_rank(1, "1", start=130, measured=22)])
    assert result.comm_group.members == {"1": [0, 1]}
    assert result.report["pg_name_rewritten"] == 1
    assert result.consistent
    got = {}
    for rank, (_, nodes) in result.ranks.items():
        a = node_attrs(nodes[1])
        got[rank] = (a["pg_name"], nodes[1].duration_micros, a["transfer_duration_micros"])
    # ends 150 and 152, latest start 130: what is left of each is the transfer
    assert got == {0: ("1", 20, 20), 1: ("1", 22, 22)}
    [group] = result.report["cross_rank"]["groups"]
    assert (group["group"], group["members"], group["absent"]) == ("1", 2, 0)


def test_convert_run_same_bytes_whatever_the_hash_seed(traces: Path, tmp_path: Path) -> None:
    import subprocess
    import sys
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"out{seed}"
        subprocess.run([sys.executable, "-m", "etweave", "convert-run", str(traces / "cpu-gloo/dist_ddp_w2"), "-o",
                        str(out), "--quiet"], check=True, env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"})
        outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outs[0] == outs[1] and len(outs[0]) == 4


def test_example_command_converts_the_bundled_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from etweave.cli import main
    assert main(["example", "-o", str(tmp_path / "ex")]) == 0
    out = capsys.readouterr().out
    assert out.count("  host_ops ") == 2 and "warnings: none" in out and "consistent" in out
    assert "linked by rf_id:" in out and "cpu_ops:" in out  # the words of the summary, explained
    assert sorted(p.name for p in (tmp_path / "ex").iterdir()) == ["comm_group.json", "report.json", "trace.0.et",
                                                                    "trace.1.et"]
    assert main(["check", str(tmp_path / "ex")]) == 0
