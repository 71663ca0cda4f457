"""etweave.collect on real PyTorch (CPU, gloo): runs recorded with it convert losslessly, with every collective a
comm node of the right type and size, consistent ranks, a clean check and a faithful replay; orphans made the way
users make them are kept and reported.

PyTorch runs only in subprocesses (the example, and the scenarios at the end of this file, run as
`python tests/test_collect.py SCENARIO DIR`): each gets a fresh process group and profiler, and a hang or crash
there fails one test instead of the session.
"""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import node_attrs, read_et
from etweave.cli import main as etweave_main
from etweave.commands import COMMANDS
from etweave.convert import run_pipeline
from etweave.deps.evidence import Evidence
from etweave.fidelity import measure
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.report import UNWAITED, reconciles

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_gloo.py"
STEPS = 3
COMM = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)


# ---------------------------------------------------------------------------------------------- helpers


def run_python(*args: str | Path, timeout: int = 240) -> None:
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def scenario(name: str, run_dir: Path) -> None:
    run_python(Path(__file__), name, run_dir)


def has_convert_run() -> bool:
    return any(m.__name__.endswith(".convert_run_cmd") for m in COMMANDS)


def convert_run_dir(run_dir: Path, out: Path) -> dict[int, dict[str, Any]]:
    """Convert every rank<N>/ of run_dir into out/trace.<N>.et; the per-rank reports."""
    if has_convert_run():
        assert etweave_main(["convert-run", str(run_dir), "-o", str(out), "--jobs", "1", "--quiet"]) == 0
        ranks = orjson.loads((out / "report.json").read_bytes())["ranks"]
        return {int(r): rep for r, rep in ranks.items()}
    from etweave.convert import convert  # until convert-run exists: one rank at a time

    out.mkdir(parents=True, exist_ok=True)
    reports = {}
    for d in sorted(run_dir.glob("rank*")):
        r = int(d.name.removeprefix("rank"))
        res = convert(d / "host.json.gz", d / "kineto.json.gz", out / f"trace.{r}.et", out / f"report.{r}.json",
                      rank=r)
        reports[r] = res.report
    return reports


def host_ids(path: Path) -> set[int]:
    return {int(n["id"]) for n in orjson.loads(gzip.decompress(path.read_bytes()))["nodes"]}


def nodes_of(out: Path, rank: int) -> list[pb.Node]:
    return read_et(out / f"trace.{rank}.et")[1]


def comm_nodes(nodes: list[pb.Node]) -> list[pb.Node]:
    return sorted((n for n in nodes if n.type in COMM), key=lambda n: n.id)  # ascending id = issue order


def describe(n: pb.Node) -> tuple[Any, ...]:
    a = node_attrs(n)
    if n.type == pb.COMM_COLL_NODE:
        return ("coll", a.get("collective_name"), a.get("comm_type"), a.get("comm_size"))
    kind = "send" if n.type == pb.COMM_SEND_NODE else "recv"
    return (kind, a.get("comm_src"), a.get("comm_dst"), a.get("comm_size"))


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_gloo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expected_comm(rank: int) -> list[tuple[Any, ...]]:
    """What the example issues per step, in order, as describe() shows it (Chakra sizes: all-gather = per-rank
    input bytes, reduce-scatter = full input; float32 = 4 bytes)."""
    ex = load_example()
    numel = ex.NUMEL
    grads = sum(p.numel() for p in ex.model().parameters())  # one DDP bucket: every gradient, float32
    step = [
        ("coll", "allreduce", pb.ALL_REDUCE, 4 * grads),  # DDP
        ("coll", "allreduce", pb.ALL_REDUCE, 4 * numel["all_reduce"]),
        ("coll", "broadcast", pb.BROADCAST, 4 * numel["broadcast"]),
        ("coll", "allgather_base", pb.ALL_GATHER, 4 * numel["all_gather"]),
        ("coll", "reduce_scatter_base", pb.REDUCE_SCATTER, 4 * numel["reduce_scatter"]),
        ("coll", "alltoall_base", pb.ALL_TO_ALL, 4 * numel["all_to_all"]),
        # barrier: no simulator type, written as ALL_REDUCE; its payload is c10d's 1-element uint8 placeholder
        ("coll", "barrier", pb.ALL_REDUCE, 1),
    ]
    size, peer = 4 * numel["send_recv"], 1 - rank
    send, recv = ("send", rank, peer, size), ("recv", peer, rank, size)
    step += [send, recv] if rank == 0 else [recv, send]
    return step * STEPS


# ---------------------------------------------------------------------------------------------- the API


def test_import_needs_no_torch() -> None:
    run_python("-c", "import sys, etweave.collect; assert 'torch' not in sys.modules, 'torch imported eagerly'")


def test_missing_torch_says_how_to_install() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from etweave.collect import collect\n"
            "try:\n    collect('unused').__enter__()\n"
            "except ImportError as e:\n    assert 'pip install etweave[collect]' in str(e), e\n"
            "else:\n    raise SystemExit('no ImportError')\n")
    run_python("-c", code)


def test_collect_writes_only_complete_windows(tmp_path: Path) -> None:
    scenario("api", tmp_path)  # the assertions run in the scenario (it needs torch)


# ---------------------------------------------------------------------------------------------- a 2-rank gloo run


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[int, dict[str, Any]]]:
    base = tmp_path_factory.mktemp("gloo")
    run_dir, out = base / "run", base / "out"
    run_python(EXAMPLE, "--out", run_dir, "--steps", str(STEPS))
    assert sorted(p.name for p in run_dir.iterdir()) == ["rank0", "rank1"]
    for r in (0, 1):
        assert sorted(p.name for p in (run_dir / f"rank{r}").iterdir()) == ["host.json.gz", "kineto.json.gz"]
    return run_dir, out, convert_run_dir(run_dir, out)


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_run_keeps_every_host_op(gloo_run: tuple[Path, Path, dict[int, dict[str, Any]]], rank: int) -> None:
    run_dir, out, reports = gloo_run
    report = reports[rank]
    ids = host_ids(run_dir / f"rank{rank}" / "host.json.gz")
    assert report["host_ops"]["input"] == report["host_ops"]["output"] == len(ids)
    assert ids <= {n.id for n in nodes_of(out, rank)}, "every host ET node keeps its id"
    assert reconciles(report) == []
    assert report["link"]["method"] == "rf_id", "one profiler session: host ET and Kineto share rf ids"
    assert {k: v for k, v in report["warnings"].items() if v} == {}


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_run_collectives_as_issued(gloo_run: tuple[Path, Path, dict[int, dict[str, Any]]], rank: int) -> None:
    _, out, reports = gloo_run
    nodes = comm_nodes(nodes_of(out, rank))
    assert [describe(n) for n in nodes] == expected_comm(rank)
    assert reports[rank]["collectives"]["input"] == reports[rank]["collectives"]["output"] == len(nodes)
    for n in nodes:
        a = node_attrs(n)
        assert a["is_cpu_op"] is False and n.data_deps, n.name
        assert n.name.startswith("gloo:"), "the gloo op that did the work"


def test_gloo_run_ranks_agree(gloo_run: tuple[Path, Path, dict[int, dict[str, Any]]]) -> None:
    _, out, _ = gloo_run
    by_rank = {r: comm_nodes(nodes_of(out, r)) for r in (0, 1)}
    colls = {r: [describe(n) for n in ns if n.type == pb.COMM_COLL_NODE] for r, ns in by_rank.items()}
    assert colls[0] == colls[1], "both ranks issue the same collectives in the same order"

    def p2p(r: int, kind: int) -> list[tuple[Any, ...]]:
        return [(a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])
                for a in (node_attrs(n) for n in by_rank[r] if n.type == kind)]

    assert p2p(0, pb.COMM_SEND_NODE) == p2p(1, pb.COMM_RECV_NODE)
    assert p2p(1, pb.COMM_SEND_NODE) == p2p(0, pb.COMM_RECV_NODE)


def test_gloo_run_passes_check(gloo_run: tuple[Path, Path, dict[int, dict[str, Any]]]) -> None:
    _, out, _ = gloo_run
    assert etweave_main(["check", str(out)]) == 0


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_run_replays_as_measured(gloo_run: tuple[Path, Path, dict[int, dict[str, Any]]], rank: int) -> None:
    # One rank converted alone: convert-run's files leave the wait for the slowest peer to the replay's
    # rendezvous (threads wait for their collectives), so alone they would replay each rank without its peers.
    run_dir, _, _ = gloo_run
    d = run_dir / f"rank{rank}"
    f = measure(run_pipeline(read_host_et(d / "host.json.gz"), read_kineto(d / "kineto.json.gz")).nodes)
    assert abs(f.critical_path_error) <= 2.0, f"critical path {f.critical_path} us vs span {f.span} us"
    assert f.collective_error_max <= 5.0, f"a collective replays {f.collective_error_max:.2f}% of the span off"
    assert f.no_predecessor == []


# Known model gap: gloo wakes a collective's waiter before it ends the collective's record (docs/FACTS.md §W3), and
# under load the worker may be descheduled in between (1 run in 16 on 2 cores: tests/data/gloo_record_tail), so the
# waiting thread resumes before the record's end. Where the thread waited at least as long as the record then stayed
# open, the waits stage cuts the collective at that resume and models the wait (tests/test_record_tail.py); a longer
# tail is only named by the audit (`issuer_resumed_before_its_end`, tested strictly below), its wait left in the idle
# node. Not strict: a run without such a tail passes.
RECORDED_WAIT_GAP = pytest.mark.xfail(strict=False, reason="gloo may end a collective's record long after its "
                                                           "waiter resumed (docs/FACTS.md §W3): not modelled")


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_run_names_every_collective_nothing_waits_for(gloo_run: tuple[Path, Path, dict[int, dict[str, Any]]],
                                                           rank: int) -> None:
    """Whatever the run's timing: a collective a gloo worker ran for another thread either gates a wake-up of that
    thread, or the report lists it as one nothing waits for (`report.UNWAITED`), and lists no other; send/recv run
    on the issuing thread are listed as that."""
    _, out, reports = gloo_run
    nodes = nodes_of(out, rank)
    attrs = {n.id: node_attrs(n) for n in nodes}
    owner = {n.id: attrs[n.id].get("part_of", n.id) for n in nodes}
    woken = {owner[d] for n in nodes if attrs[n.id]["kind"] == "wakeup" for d in n.data_deps}
    listed = {c["node"]: c["why"] for c in reports[rank]["collectives_without_dependents"]}
    inline = {nid for nid, why in listed.items() if why == "ran_on_issuing_thread"}
    by_id = {n.id: n for n in nodes}
    assert {by_id[nid].name for nid in inline} <= {"gloo:send", "gloo:recv"}
    unwaited = {nid for nid, why in listed.items() if why in UNWAITED}
    assert set(listed) == inline | unwaited
    for n in comm_nodes(nodes):
        if n.id not in inline:
            assert (n.id in woken) != (n.id in unwaited), f"{n.id} {n.name}: woken {n.id in woken}, listed {listed}"


@RECORDED_WAIT_GAP
@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_run_threads_wait_for_their_collectives(gloo_run: tuple[Path, Path, dict[int, dict[str, Any]]],
                                                      rank: int) -> None:
    """Every collective a gloo worker ran for the issuing thread gates a wake-up of that thread through a wait
    edge (`thread_wait`), so a slower collective delays the thread that waited for it; only send/recv, which
    gloo runs on the issuing thread itself, have none, and the report lists exactly those."""
    _, out, reports = gloo_run
    nodes = nodes_of(out, rank)
    attrs = {n.id: node_attrs(n) for n in nodes}
    by_id = {n.id: n for n in nodes}
    owner = {n.id: attrs[n.id].get("part_of", n.id) for n in nodes}  # a period stands for its op
    woken: dict[int, set[int]] = {}  # comm node -> threads whose wake-up depends on it
    for n in nodes:
        if attrs[n.id]["kind"] == "wakeup":
            for d in n.data_deps:
                woken.setdefault(owner[d], set()).add(attrs[n.id]["tid"])
    comm = comm_nodes(nodes)
    inline = []
    names = {n.id: n.name for n in nodes}

    def issuing_op(nid: int) -> int | None:
        """The op that issued collective `nid`: its host ET parent, above any gloo op the host ET recorded it in (a
        worker's op is recorded inside the op open on the ET thread then, another worker's collective too)."""
        parent = attrs[nid].get("et_parent")
        while parent in attrs and names[parent].startswith("gloo:"):
            parent = attrs[parent].get("et_parent")
        return parent if parent in attrs else None

    for n in comm:
        issuer_op = issuing_op(n.id)
        issuer = attrs[issuer_op]["tid"] if issuer_op is not None else None
        if issuer == attrs[n.id]["tid"]:
            inline.append(n.id)
            continue
        assert issuer is not None and issuer in woken.get(n.id, set()), f"nothing waits for {n.id} {n.name}"
    assert {by_id[i].name for i in inline} <= {"gloo:send", "gloo:recv"}
    listed = reports[rank]["collectives_without_dependents"]
    assert sorted(c["node"] for c in listed) == sorted(inline)
    assert {c["why"] for c in listed} <= {"ran_on_issuing_thread"}


# ---------------------------------------------------------------------------------------------- orphans


def orphaned_comm(nodes: list[pb.Node]) -> list[pb.Node]:
    """Comm nodes that are orphans or lie below one (host ET parent chain)."""
    attrs = {n.id: node_attrs(n) for n in nodes}

    def below_orphan(nid: int) -> bool:
        seen: set[int] = set()
        while nid in attrs and nid not in seen:
            seen.add(nid)
            if "orphan_parent" in attrs[nid]:
                return True
            parent = attrs[nid].get("et_parent")
            if not isinstance(parent, int):
                return False
            nid = parent
        return False

    return [n for n in comm_nodes(nodes) if below_orphan(n.id)]


def check_orphans(run_dir: Path, out: Path, expect_comm: int, comm_size: int) -> dict[str, Any]:
    report = convert_run_dir(run_dir, out)[0]
    ids = host_ids(run_dir / "rank0" / "host.json.gz")
    nodes = nodes_of(out, 0)
    by_id = {n.id: n for n in nodes}
    assert ids <= set(by_id), "every host ET node keeps its id, orphans included"
    assert report["host_ops"]["input"] == report["host_ops"]["output"] == len(ids)
    assert reconciles(report) == []
    assert {k: v for k, v in report["warnings"].items() if v} == {}
    orphans = report["orphans"]
    assert orphans["count"] > 0 and orphans["missing_parents"], "the orphans are reported"
    for m in orphans["missing_parents"]:
        assert m["id"] not in ids, "a missing parent is not in the host ET"
        assert m["orphans"] > 0
    assert sum(len(m["collectives"]) for m in orphans["missing_parents"]) == expect_comm
    comm = orphaned_comm(nodes)
    assert len(comm) == expect_comm, [describe(n) for n in comm]
    for n in comm:
        assert describe(n) == ("coll", "allreduce", pb.ALL_REDUCE, comm_size)
        preds = [by_id[d] for d in n.data_deps]
        assert any(p.type != pb.METADATA_NODE for p in preds), f"{n.id} {n.name} has no real predecessor"
        assert any(p.name == "c10d::allreduce_" for p in preds), f"{n.id} does not follow the call that issued it"
    assert etweave_main(["check", str(out)]) == 0
    return report


def test_orphans_observer_stopped_inside_record_function(tmp_path: Path) -> None:
    scenario("open_record_function", tmp_path / "run")
    report = check_orphans(tmp_path / "run", tmp_path / "out", expect_comm=1, comm_size=4 * 64 * 64)
    assert len(report["orphans"]["missing_parents"]) == 1, "one missing parent: `outer`"


def test_orphans_on_a_second_thread(tmp_path: Path) -> None:
    scenario("second_thread", tmp_path / "run")
    report = check_orphans(tmp_path / "run", tmp_path / "out", expect_comm=3, comm_size=4 * 32 * 32)
    steps = [a for n in nodes_of(tmp_path / "out", 0) if (a := node_attrs(n)).get("kind") == "host_op"
             and n.name.startswith("ProfilerStep#")]
    main_threads = {a["et_tid"] for a in steps}
    assert len(steps) == 2 and len(main_threads) == 1
    missing = report["orphans"]["missing_parents"]
    assert len(missing) == 1 and missing[0]["thread"] not in main_threads, "one missing parent: `bg_loop`"


def test_main_thread_waits_for_the_helper_it_joins(tmp_path: Path) -> None:
    """Each step hands work to a new helper thread, does shorter work of its own, then joins the helper: the
    helper's work is gated by an edge from the main thread, and the main thread resumes after the helper's work
    (a wake-up after a wait edge), so a slower helper would delay it and a faster one would not be hidden. Where
    the main thread's own work outlasted the helper's (a loaded machine: its 1 ms took longer than the helper's
    5 ms) the join did not wait, and no wake-up after that work may depend on the helper."""
    scenario("helper_join", tmp_path / "run")
    d = tmp_path / "run" / "rank0"
    result = run_pipeline(read_host_et(d / "host.json.gz"), read_kineto(d / "kineto.json.gz"))
    g = result.graph
    helpers = [it for it in g.items if it.name == "helper_work" and it.measured]
    (main,) = {it.tid for it in g.items if it.name == "main_work" and it.measured}
    assert len(helpers) == 2 and all(h.tid != main for h in helpers)
    preds = result.deps.preds
    for h in helpers:
        chain = [g.by_id[i] for i in g.threads[h.tid]]
        upto = chain[:chain.index(h) + 1]
        handed = [g.by_id[e.src] for it in upto for e in preds.get(it.id, ()) if e.source is Evidence.HANDOFF]
        assert any(src.tid == main for src in handed), "the helper's work follows the main thread's hand-over"
        end = h.start + h.dur
        woken = [it for it in g.items if it.kind == "wakeup" and it.tid == main
                 and any(e.source is Evidence.THREAD_WAIT and g.by_id[e.src].tid == h.tid
                         and g.by_id[e.src].start >= h.start and g.by_id[e.src].seg_end >= end - 1
                         for e in preds.get(it.id, ()))]
        step = next(it for it in g.items if it.name.startswith("ProfilerStep#") and it.tid == main and it.measured
                    and it.start <= h.start < it.start + it.dur)
        (own,) = (it for it in g.items if it.name == "main_work" and it.measured and it.enclosing == step.id)
        if own.start + own.dur < end:  # the main thread reached the join while the helper still worked
            assert len(woken) == 1, "the main thread's join ends in a wake-up after the helper's work"
        else:
            assert not [it for it in woken if it.start >= own.start + own.dur], "the join did not wait: done"
    assert abs(measure(result.nodes).critical_path_error) <= 2.0


# ---------------------------------------------------------------------------------------------- scenarios
# Run in a fresh interpreter (see the module docstring). One process, gloo group of size 1.


def _init_gloo(run_dir: Path) -> None:
    import torch.distributed as dist

    run_dir.mkdir(parents=True, exist_ok=True)
    store = run_dir.with_name(f"{run_dir.name}.store")  # beside the run folder: only traces go in it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


def _scenario_open_record_function(run_dir: Path) -> None:
    """The ET observer stopped while `outer` is open: `outer` is never written, its children point at it."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

    _init_gloo(run_dir)
    out = run_dir / "rank0"
    out.mkdir()
    et = ExecutionTraceObserver().register_callback(str(out / "host.json.gz"))
    cfg = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, execution_trace_observer=et,
                 experimental_config=cfg) as prof:
        x = torch.randn(64, 64)
        y = (x @ x).relu()
        with record_function("outer"):
            z = (y @ x).sigmoid()
            dist.all_reduce(z)
            z = z + 1
            et.stop()
            dist.all_reduce(z * 2)  # after the stop: in the Kineto trace only
    prof.export_chrome_trace(str(out / "kineto.json.gz"))
    dist.destroy_process_group()


def _scenario_second_thread(run_dir: Path) -> None:
    """A user thread opens `bg_loop` inside the recorded window and is still in it when the window closes."""
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from etweave.collect import collect

    _init_gloo(run_dir)
    started, done, release = threading.Event(), threading.Event(), threading.Event()

    def background() -> None:
        started.wait()
        with record_function("bg_loop"):
            for _ in range(3):
                a = torch.randn(32, 32)
                dist.all_reduce((a @ a).tanh())
            done.set()
            release.wait()  # still open when the observer stops at the step boundary

    t = threading.Thread(target=background)
    t.start()
    x = torch.randn(64, 64)
    try:
        with collect(run_dir, steps=2) as c:
            for i in range(c.total_steps):
                if i == c.wait + c.warmup:  # the first recorded step
                    started.set()
                (x @ x).relu()
                if i == c.total_steps - 1:
                    done.wait(60)
                c.step()
    finally:
        started.set()
        release.set()
        t.join()
    dist.destroy_process_group()


def _scenario_helper_join(run_dir: Path) -> None:
    """Each recorded step: start a helper thread (5 ms of work), do 1 ms of work, join the helper."""
    import torch
    from torch.profiler import record_function

    from etweave.collect import collect

    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def work(name: str, seconds: float) -> None:
        with record_function(name):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                (a @ b).tanh()

    with collect(run_dir, rank=0, steps=2) as c:
        for _ in range(c.total_steps):
            helper = threading.Thread(target=work, args=("helper_work", 0.005))
            helper.start()
            work("main_work", 0.001)
            helper.join()
            c.step()


def _scenario_api(run_dir: Path) -> None:
    import torch

    from etweave.collect import collect

    x = torch.randn(16, 16)
    # No process group: the rank is the argument; steps after the window are not recorded.
    done_after: list[int] = []
    with collect(run_dir / "ok", rank=5, steps=1) as c:
        assert (c.rank, c.total_steps) == (5, 2)
        for _ in range(4):
            x = (x @ x).tanh()
            c.step()
            done_after.append(c.done)
    assert done_after == [False, True, True, True], "written at the end of the window, not at the exit"
    assert sorted(p.name for p in (run_dir / "ok" / "rank5").iterdir()) == ["host.json.gz", "kineto.json.gz"]
    # Left before the first recorded step (still in warm-up): an error, and no file.
    try:
        with collect(run_dir / "short", steps=2, warmup=1) as c:
            (x @ x).tanh()
    except RuntimeError as exc:
        assert "nothing was written" in str(exc)
    else:
        raise AssertionError("no error for a window that never started")
    assert list((run_dir / "short" / "rank0").iterdir()) == []
    # A step that raises: the exception propagates, no (partial) file is left.
    try:
        with collect(run_dir / "failed", steps=2) as c:
            c.step()
            c.step()
            raise KeyError("in the step")
    except KeyError:
        pass
    assert list((run_dir / "failed" / "rank0").iterdir()) == []


if __name__ == "__main__":
    {"open_record_function": _scenario_open_record_function, "second_thread": _scenario_second_thread,
     "api": _scenario_api, "helper_join": _scenario_helper_join}[sys.argv[1]](Path(sys.argv[2]))
