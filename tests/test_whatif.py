"""What-if edits (`etweave simulate --scale/--set-duration/--comm-bandwidth`, `etweave.simulate.whatif`) and the
structure of the graphs that `bench/whatif` predicts from.

The edit tests run on the shared `cpu-gloo/dist_ddp_w2` run, converted once. The structural tests record the
benchmark's straggler pairs once per session (2 gloo ranks, 2 steps, in a subprocess: PyTorch never runs in the
test process) and check which nodes a changed op can reach, not timings.
"""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from fnmatch import fnmatchcase
from pathlib import Path

import orjson
import pytest

from etweave.chakra import et_def_pb2 as pb
from etweave.cli import main as etweave_main
from etweave.errors import BadInput
from etweave.nodes import is_marker_node
from etweave.run import convert_run
from etweave.simulate.engine import RankGraph, replay
from etweave.simulate.load import load_comm_group, load_rank
from etweave.simulate.steps import step_bounds, step_times
from etweave.simulate.whatif import apply, fit_groups, parse_edit, read_transfers

REPO = Path(__file__).resolve().parents[1]
COMM = (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
CPU_KINDS = ("host_op", "runtime", "self_part", "resume")
RECORDED = ("straggler", "straggler_hidden", "async_allreduce", "compute4x")  # bench/whatif pairs the tests record


@pytest.fixture(scope="module")
def ddp(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    convert_run(traces / "cpu-gloo/dist_ddp_w2", out, jobs=1)
    return out


def load(out: Path) -> list[RankGraph]:
    return [load_rank(f) for f in sorted(out.glob("*.et"))]


def durations(ranks: list[RankGraph]) -> list[list[int]]:
    return [[nd.duration for nd in rg.nodes] for rg in ranks]


def op_name(rg: RankGraph) -> dict[int, str]:
    """Node id -> the name of the op it is time of (its own, or its part_of op's)."""
    by_id = {nd.id: nd for nd in rg.nodes}
    return {nd.id: by_id[nd.part_of].name if nd.kind in ("self_part", "resume") else nd.name for nd in rg.nodes}


# ---------------------------------------------------------------------------------------------- edits


@pytest.mark.parametrize("glob", ["aten::mm", "aten::*mm*", "ProfilerStep#*"])
def test_scale_by_name_changes_exactly_the_ops_and_their_parts(ddp: Path, glob: str) -> None:
    ranks = load(ddp)
    before = durations(ranks)
    measured = [[(nd.measured_start, nd.measured_duration) for nd in rg.nodes] for rg in ranks]
    [res] = apply(ranks, [parse_edit("scale", f"name={glob}:3")])
    changed = 0
    for ri, rg in enumerate(ranks):
        names = op_name(rg)
        for i, nd in enumerate(rg.nodes):
            selected = fnmatchcase(names[nd.id], glob)
            assert nd.duration == (round(3 * before[ri][i]) if selected else before[ri][i]), nd.name
            assert (nd.measured_start, nd.measured_duration) == measured[ri][i]  # the measured run stays
            changed += selected
    assert res.nodes == changed > 0
    if glob == "ProfilerStep#*":  # an op with [self] parts: every part is its time
        assert res.nodes > res.ops


def test_kind_selects_by_class_and_never_delays(ddp: Path) -> None:
    ranks = load(ddp)
    before = durations(ranks)
    [res] = apply(ranks, [parse_edit("scale", "kind=cpu:2")])
    cpu = 0
    for ri, rg in enumerate(ranks):
        for i, nd in enumerate(rg.nodes):
            is_cpu = nd.type not in (*COMM, pb.METADATA_NODE) and nd.kind in CPU_KINDS
            assert nd.duration == (2 * before[ri][i] if is_cpu else before[ri][i]), (nd.name, nd.kind)
            cpu += is_cpu
    assert res.nodes == cpu > 0
    assert any(nd.kind == "delay" and nd.duration for rg in ranks for nd in rg.nodes)  # delays exist, untouched
    with pytest.raises(BadInput, match="selects no node"):  # a CPU run has no GPU work
        apply(ranks, [parse_edit("scale", "kind=gpu:2")])


def test_metadata_nodes_are_never_edited(ddp: Path) -> None:
    ranks = load(ddp)
    [res] = apply(ranks, [parse_edit("set-duration", "name=*:5")])
    metadata = [nd for rg in ranks for nd in rg.nodes if is_marker_node(nd.type, nd.kind)]
    assert metadata and all(nd.duration == 0 for nd in metadata)
    assert res.ops == sum(not is_marker_node(nd.type, nd.kind) and nd.kind not in ("self_part", "resume")
                          for rg in ranks for nd in rg.nodes)


def test_comm_bandwidth_times_the_ranks_given_from_the_fit(ddp: Path) -> None:
    """`--comm-bandwidth rank=1:4` edits rank 1's communication nodes only, each losing three quarters of the
    bandwidth time its (process group, kind) fit over both ranks gives its size; unsized ones are divided by 4."""
    ranks = load(ddp)
    before = durations(ranks)
    transfers = [read_transfers(rg) for rg in ranks]
    fits = fit_groups(ranks, transfers)
    [res] = apply(ranks, [parse_edit("comm-bandwidth", "rank=1:4")])
    sized = 0
    for ri, rg in enumerate(ranks):
        for i, nd in enumerate(rg.nodes):
            if nd.type not in COMM or rg.rank != 1:
                assert nd.duration == before[ri][i]
                continue
            t = transfers[ri][nd.id]
            if t.size > 0:
                sized += 1
                fit = fits[(nd.pg or "", t.kind)]
                assert nd.duration == max(0, round(before[ri][i] - t.size * fit.us_per_byte * 3 / 4))
            else:
                assert nd.duration == round(before[ri][i] / 4)
    assert sized > 0 and res.nodes == sum(nd.type in COMM for nd in ranks[1].nodes)
    assert res.unfitted == res.nodes - sized


def test_plain_comm_scale_divides_each_node(ddp: Path) -> None:
    """The per-node form of a bandwidth change: `--scale kind=comm:0.25` divides each node's own time."""
    ranks = load(ddp)
    before = durations(ranks)
    apply(ranks, [parse_edit("scale", "kind=comm:0.25")])
    for ri, rg in enumerate(ranks):
        for i, nd in enumerate(rg.nodes):
            assert nd.duration == (round(before[ri][i] * 0.25) if nd.type in COMM else before[ri][i])


def test_set_duration_per_step_gives_each_op_exactly_that_time(ddp: Path) -> None:
    ranks = load(ddp)
    steps = sorted(step_bounds(ranks[0].nodes))
    assert len(steps) >= 2
    step = steps[-1]
    [res] = apply(ranks, [parse_edit("set-duration", f"name=aten::mm,rank=0,step={step}:777")])
    lo, hi = step_bounds(ranks[0].nodes)[step]
    names = op_name(ranks[0])
    totals: dict[str, int] = {}
    for nd in ranks[0].nodes:
        if names[nd.id] == "aten::mm" and lo <= nd.measured_start < hi:
            key = str(nd.part_of if nd.kind in ("self_part", "resume") else nd.id)
            totals[key] = totals.get(key, 0) + nd.duration
    assert totals and set(totals.values()) == {777}
    assert res.ops == len(totals) and res.after_us == 777 * len(totals)


def test_edits_apply_in_order(ddp: Path) -> None:
    ranks = load(ddp)
    apply(ranks, [parse_edit("set-duration", "name=aten::mm:100"), parse_edit("scale", "name=aten::mm:2")])
    names = op_name(ranks[0])
    op_totals: dict[int, int] = {}
    for nd in ranks[0].nodes:
        if names[nd.id] == "aten::mm":
            owner = nd.part_of if nd.kind in ("self_part", "resume") else nd.id
            op_totals[owner] = op_totals.get(owner, 0) + nd.duration
    assert all(abs(v - 200) <= 2 for v in op_totals.values())  # per-part rounding


@pytest.mark.parametrize(("action", "text", "says"), [
    ("scale", "name=aten::mm", "'mm' is not a number"),
    ("scale", "name=x", "expected SELECTOR:NUMBER"),
    ("scale", "name=aten::mm:x", "is not a number"),
    ("scale", "name=aten::mm:-1", ">= 0"),
    ("scale", "name=aten::mm:nan", ">= 0"),
    ("scale", "nme=aten::mm:2", "key one of"),
    ("scale", ":2", "empty selector"),
    ("scale", "rank=a:2", "expected numbers or ranges"),
    ("scale", "rank=3-1:2", "is empty"),
    ("scale", "name=a,name=b:2", "twice"),
    ("comm-bandwidth", "0", "> 0"),
    ("comm-bandwidth", "kind=gpu:2", "communication nodes only"),
])
def test_bad_edits_are_bad_input(action: str, text: str, says: str) -> None:
    with pytest.raises(BadInput, match=says):
        parse_edit(action, text)


def test_cli_what_if(ddp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert etweave_main(["simulate", str(ddp), "--json"]) == 0
    plain = orjson.loads(capsys.readouterr().out)
    assert etweave_main(["simulate", str(ddp), "--json", "--scale", "name=aten::mm:1"]) == 0
    noop = orjson.loads(capsys.readouterr().out)
    assert noop["step_times"] == plain["step_times"] and noop["whatif"][0]["added_us"] == 0
    steps = [s["step"] for s in plain["step_times"]["steps"]]
    assert steps and all(s["measured_us"] > 0 for s in plain["step_times"]["steps"])
    # the edit keeps the measured times of the run and moves the simulated ones
    args = ["simulate", str(ddp), "--json", "--comm-bandwidth", "0.01", "--scale", f"kind=cpu,step={steps[0]}:5"]
    assert etweave_main(args) == 0
    slow = orjson.loads(capsys.readouterr().out)
    assert [e["edit"] for e in slow["whatif"]] == ["--comm-bandwidth 0.01", f"--scale kind=cpu,step={steps[0]}:5"]
    assert [s["measured_us"] for s in slow["step_times"]["steps"]] == \
           [s["measured_us"] for s in plain["step_times"]["steps"]]
    assert slow["step_times"]["steps"][0]["simulated_us"] > plain["step_times"]["steps"][0]["simulated_us"]
    assert etweave_main(["simulate", str(ddp), "--scale", "name=aten::mm:2"]) == 0
    text = capsys.readouterr().out
    assert "what-if" in text and "--scale name=aten::mm:2" in text and f"ProfilerStep#{steps[0]}:" in text


@pytest.mark.parametrize("args", [["--scale", "name=no_such_op:2"], ["--set-duration", "name=aten::mm"],
                                  ["--comm-bandwidth", "-2"]])
def test_cli_bad_edit_one_line_exit_2(ddp: Path, args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "etweave", "simulate", str(ddp), *args], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("etweave: error: --")


# ---------------------------------------------------------------------------------------------- recorded pairs


@pytest.fixture(scope="session")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench/whatif's straggler, async and compute pairs, recorded once: 2 gloo ranks, 2 steps; converted under
    <pair>/<side>."""
    runs = tmp_path_factory.mktemp("whatif")
    proc = subprocess.run([sys.executable, "-m", "bench.whatif.workload", str(runs / "runs"), "--repeats", "1",
                           "--steps", "2", "--pairs", ",".join(RECORDED)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    for pair in RECORDED:
        for side in "AB":
            convert_run(runs / "runs" / pair / side / "r0", runs / pair / side, jobs=1)
    return runs


def reach(ranks: list[RankGraph], start: tuple[int, int]) -> set[tuple[int, int]]:
    """(rank index, node index) reachable from `start` along dependencies, crossing ranks where a collective
    completes on every member at once (the k-th of a group on each rank, as the replay matches them)."""
    children: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for ri, rg in enumerate(ranks):
        pos = {nd.id: i for i, nd in enumerate(rg.nodes)}
        for i, nd in enumerate(rg.nodes):
            for d in nd.deps:
                children.setdefault((ri, pos[d]), []).append((ri, i))
    for inst in replay(ranks, load_comm_group_of(ranks)).collectives:
        for a in inst.nodes:
            children.setdefault(a, []).extend(b for b in inst.nodes if b != a)
    seen = {start}
    todo = deque([start])
    while todo:
        for c in children.get(todo.popleft(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def load_comm_group_of(ranks: list[RankGraph]) -> dict[str, list[int]]:
    group_file = Path(ranks[0].source).parent / "comm_group.json"
    return load_comm_group(group_file) if group_file.exists() else {}


def in_step(rg: RankGraph, name: str, step: int) -> int:
    """Index of the op `name` that started in ProfilerStep#step of this rank (exactly one)."""
    lo, hi = step_bounds(rg.nodes)[step]
    [i] = [i for i, nd in enumerate(rg.nodes)
           if nd.name == name and nd.kind == "host_op" and lo <= nd.measured_start < hi]
    return i


def test_straggler_edits_select_the_straggle_op_of_each_step(pairs: Path) -> None:
    from bench.whatif.workload import PAIRS

    ranks = load(pairs / "straggler" / "A")
    steps = sorted(step_bounds(ranks[0].nodes))
    assert len(steps) == 2
    results = apply(ranks, [parse_edit(a, t) for a, t in PAIRS["straggler"].edits(steps, 1.0)])
    assert [r.ops for r in results] == [1, 1]
    for step in steps:  # the straggler of step k is rank k % 2, and only its straggle op got the 26 ms
        rg = ranks[step % 2]
        i = in_step(rg, "straggle", step)
        parts = [nd.duration for nd in rg.nodes if nd.id == rg.nodes[i].id or nd.part_of == rg.nodes[i].id]
        assert sum(parts) == 26000
        other = ranks[1 - step % 2]
        assert other.nodes[in_step(other, "straggle", step)].duration < 26000 // 2


def test_naive_estimate_adds_each_steps_largest_rank_once(pairs: Path) -> None:
    """bench/whatif's naive estimate: the straggler edits add (26 ms - the op's time in A) once per step."""
    from bench.whatif.__main__ import naive_added
    from bench.whatif.workload import PAIRS

    ranks = load(pairs / "straggler" / "A")
    steps = sorted(step_bounds(ranks[0].nodes))
    before = durations(ranks)
    expected = 0
    for step in steps:
        rg = ranks[step % 2]
        op = rg.nodes[in_step(rg, "straggle", step)].id
        expected += 26000 - sum(nd.duration for nd in rg.nodes if op in (nd.id, nd.part_of))
    apply(ranks, [parse_edit(a, t) for a, t in PAIRS["straggler"].edits(steps, 1.0)])
    assert naive_added(ranks, before) == expected > 0


def test_straggler_replays_each_side_as_measured(pairs: Path) -> None:
    """The graph of each side replays to its own measured step times: the predictions start from a faithful A."""
    for side in "AB":
        ranks = load(pairs / "straggler" / side)
        times = step_times(replay(ranks, load_comm_group_of(ranks)))
        assert times["steps"] and abs(times["span"]["error_pct"]) < 2.0


def test_straggler_reaches_every_ranks_resumed_node(pairs: Path) -> None:
    """In B, the straggle op of step k (on rank k % 2) delays every rank in step k: each rank's `frame_after` of
    step k (what its main thread does once the all_reduce returned) is reachable from it."""
    ranks = load(pairs / "straggler" / "B")
    for step in sorted(step_bounds(ranks[0].nodes)):
        straggler = step % 2
        reached = reach(ranks, (straggler, in_step(ranks[straggler], "straggle", step)))
        missing = [rg.rank for ri, rg in enumerate(ranks) if (ri, in_step(rg, "frame_after", step)) not in reached]
        assert not missing, f"step {step}: frame_after of ranks {missing} does not depend on the straggler"


def test_hidden_straggler_does_not_reach_threads_that_did_not_wait(pairs: Path) -> None:
    """Control: rank 0's background thread of each step (`bg_tick`, woken by its own sleep) never waits for the
    main thread after it started, and rank 1's `slow_rank` / `straggle` ran before rank 0's straggle could matter:
    none is reachable from it. (The next step's background thread is started by the main thread after the straggle,
    so its start does follow it.)"""
    ranks = load(pairs / "straggler_hidden" / "B")
    rank0 = ranks[0]
    started: dict[str | None, int] = {}  # background thread -> when its first tick began
    for nd in rank0.nodes:
        if nd.name == "bg_tick":
            started[nd.resource] = min(started.get(nd.resource, nd.measured_start), nd.measured_start)
    assert len(started) == len(step_bounds(rank0.nodes))  # one background thread per step
    for step in sorted(step_bounds(rank0.nodes)):
        i = in_step(rank0, "straggle", step)
        running = {r for r, t in started.items() if t < rank0.nodes[i].measured_start}
        assert running
        reached = reach(ranks, (0, i))
        on_bg = [rank0.nodes[j].name for ri, j in reached if ri == 0 and rank0.nodes[j].resource in running]
        assert not on_bg, f"step {step}: {len(on_bg)} nodes of a running background thread reachable, e.g. {on_bg[:3]}"
        for name in ("slow_rank", "straggle"):
            assert (1, in_step(ranks[1], name, step)) not in reached


def comm_in_step(rg: RankGraph, step: int) -> list[int]:
    """Indices of the collectives of this rank whose measured start lies in ProfilerStep#step."""
    lo, hi = step_bounds(rg.nodes)[step]
    return [i for i, nd in enumerate(rg.nodes) if nd.type == pb.COMM_COLL_NODE and lo <= nd.measured_start < hi]


@pytest.mark.parametrize("side", ["A", "B"])
def test_async_wait_depends_on_the_all_reduce(pairs: Path, side: str) -> None:
    """The async all_reduce of step k (on a gloo worker) gates what the main thread does once `work.wait()`
    returned: each rank's `frame_after` of step k is reachable from it, so a longer transfer moves the step."""
    ranks = load(pairs / "async_allreduce" / side)
    for step in sorted(step_bounds(ranks[0].nodes)):
        for ri, rg in enumerate(ranks):
            [coll] = comm_in_step(rg, step)
            assert rg.nodes[coll].name == "gloo:all_reduce"
            assert (ri, in_step(rg, "frame_after", step)) in reach(ranks, (ri, coll)), \
                f"rank {rg.rank} step {step}: the wait does not depend on the all_reduce"


def test_compute_op_reaches_the_rank_that_waits_for_it(pairs: Path) -> None:
    """compute4x: rank 1's `aten::mm` of step k delays rank 0 in step k (through the all_reduce rank 0 waits in),
    and rank 0's own `frame_before` of that step (before the all_reduce) does not depend on it."""
    ranks = load(pairs / "compute4x" / "A")
    for step in sorted(step_bounds(ranks[0].nodes)):
        reached = reach(ranks, (1, in_step(ranks[1], "aten::mm", step)))
        assert (0, in_step(ranks[0], "frame_after", step)) in reached
        assert (0, in_step(ranks[0], "frame_before", step)) not in reached
