"""`simulate --model astra-sim --network fitted`: the ring's latency and bandwidth fitted to the measured transfer
times (etweave/simulate/netfit.py). The fit recovers a known network from the times that network gives; the robust
fit ignores and lists collectives far from the rest; the fitted run of the bundled example (a real gloo run) comes
within 5% of its measured span (measured: 0.974x; the default ring gives 0.613x), and the fitted network, written
as ASTRA-sim's yml, reads back to the same run; a run with nothing to fit and a per-type network written as yml
are bad input (exit 2, one line, no file)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from msgspec.structs import replace

from etweave.chakra import et_def_pb2 as pb
from etweave.cli import main
from etweave.commands.example_cmd import example_dir
from etweave.run import convert_run
from etweave.simulate.astra import AstraNode, AstraRank, load_for_astra, measured_span_us, simulate
from etweave.simulate.load import load_comm_group
from etweave.simulate.netfit import fit_network, fit_samples, samples_of
from etweave.simulate.network import Network, collective_ns, load_network, send_ns

TRUE = Network("Ring", 12.5, 20000.0)
TYPES = (pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL)
SIZES = (1000, 40_000, 1 << 20, 7_000_000)


def coll(nid: int, comm_type: int, size: int, pg: str = "") -> AstraNode:
    return AstraNode(id=nid, name=f"c{nid}", type=pb.COMM_COLL_NODE, deps=(), duration_us=0, is_cpu_op=False,
                     comm_type=comm_type, comm_size=size, pg=pg)


def send(nid: int, src: int, dst: int, size: int) -> AstraNode:
    return AstraNode(id=nid, name=f"s{nid}", type=pb.COMM_SEND_NODE, deps=(), duration_us=0, is_cpu_op=False,
                     comm_size=size, comm_src=src, comm_dst=dst, comm_tag=1)


def four_ranks() -> tuple[list[AstraRank], dict[str, list[int]]]:
    """Every timed type at several sizes, in the world (4 NPUs) and in a 2-member group; sends 0→1 and 0→2."""
    nodes = []
    for t in TYPES:
        for size in SIZES:
            nodes += [coll(len(nodes) + 1, t, size), coll(len(nodes) + 2, t, size, pg="7")]
    nodes += [send(len(nodes) + 1, 0, 1, 5000), send(len(nodes) + 2, 0, 2, 3 << 20)]
    return [AstraRank(0, nodes)] + [AstraRank(r, []) for r in (1, 2, 3)], {"7": [0, 1]}


def true_ns(net: Network, nd_comm: str, size: int, p: int, src_dst: tuple[int, int] = (0, 1)) -> int:
    if nd_comm == "SEND":
        return send_ns(net, size, *src_dst, 4)
    return collective_ns(net, pb.CollectiveCommType.Value(nd_comm), size, p)


def test_coefficients_reproduce_the_network_formula() -> None:
    # the regression is the model: a·L + b·S + c is collective_ns / send_ns before rounding, for every sample
    ranks, groups = four_ranks()
    samples = samples_of(ranks, groups)
    assert len(samples) == 2 * len(TYPES) * len(SIZES) + 2
    assert {s.group_size for s in samples if s.comm != "SEND"} == {2, 4}
    nodes = {nd.id: nd for nd in ranks[0].nodes}
    for s in samples:
        nd = nodes[s.node_id]
        want = true_ns(TRUE, s.comm, s.comm_size, s.group_size, (nd.comm_src or 0, nd.comm_dst or 0))
        assert abs(s.predicted_ns(TRUE.latency_ns, 1 / TRUE.bytes_per_ns) - want) <= 0.5


def _measured_by(net: Network, ranks: list[AstraRank], groups: dict[str, list[int]]) -> list:
    nodes = {nd.id: nd for nd in ranks[0].nodes}
    return [replace(s, measured_ns=true_ns(net, s.comm, s.comm_size, s.group_size,
                                           (nodes[s.node_id].comm_src or 0, nodes[s.node_id].comm_dst or 0)))
            for s in samples_of(ranks, groups)]


@pytest.mark.parametrize("robust", [False, True])
def test_fit_recovers_a_known_network(robust: bool) -> None:
    ranks, groups = four_ranks()
    fit = fit_samples(_measured_by(TRUE, ranks, groups), robust=robust)
    # the times are whole ns, so the parameters come back to the rounding of 1 ns in µs-to-ms times
    assert fit.network.latency_ns == pytest.approx(TRUE.latency_ns, rel=1e-5)
    assert fit.network.bandwidth_gbps == pytest.approx(TRUE.bandwidth_gbps, rel=1e-5)
    assert max(abs(r) for r in fit.residual_ns) <= 1.0
    assert fit.outliers == [] and fit.notes == []


def test_robust_fit_ignores_and_lists_outliers_least_squares_does_not() -> None:
    ranks, groups = four_ranks()
    samples = _measured_by(TRUE, ranks, groups)
    slow = [0, 9]  # e.g. gloo's first all-reduce: 5 ms of connection set-up
    for i in slow:
        samples[i] = replace(samples[i], measured_ns=samples[i].measured_ns + 5_000_000)
    robust = fit_samples(samples, robust=True)
    assert robust.network.latency_ns == pytest.approx(TRUE.latency_ns, rel=1e-3)
    assert robust.network.bandwidth_gbps == pytest.approx(TRUE.bandwidth_gbps, rel=1e-3)
    assert robust.outliers == slow
    assert [o["measured_us"] - o["fitted_us"] for o in robust.summary()["outliers"]] == pytest.approx([5000] * 2,
                                                                                                    abs=1)
    plain = fit_samples(samples, robust=False)
    assert plain.network.latency_ns > 1.1 * TRUE.latency_ns  # the slow two pull the plain fit


def test_per_type_fit_recovers_a_pair_per_type() -> None:
    ranks, groups = four_ranks()
    other = Network("Ring", 3.0, 70000.0)
    samples = [s if s.comm != "ALL_GATHER" else replace(s, measured_ns=true_ns(other, s.comm, s.comm_size,
                                                                              s.group_size))
               for s in _measured_by(TRUE, ranks, groups)]
    one = fit_samples(samples, robust=False)
    assert max(abs(r) for r in one.residual_ns) > 1e5  # one pair cannot fit both
    fit = fit_samples(samples, robust=False, per_type=True)
    pairs = {c: (b, lat) for c, b, lat in fit.network.per_type}
    assert set(pairs) == {"ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "SEND"}
    assert pairs["ALL_GATHER"] == pytest.approx((3.0, 70000.0), rel=1e-5)
    for comm in ("ALL_REDUCE", "REDUCE_SCATTER", "ALL_TO_ALL", "SEND"):
        assert pairs[comm] == pytest.approx((12.5, 20000.0), rel=1e-4), comm
    # the model times each type with its own pair
    assert collective_ns(fit.network, pb.ALL_GATHER, 1 << 20, 2) == pytest.approx(
        collective_ns(other, pb.ALL_GATHER, 1 << 20, 2), abs=2)
    assert max(abs(r) for r in fit.residual_ns) <= 1.0


def test_the_astra_model_times_each_type_with_its_own_pair() -> None:
    # a per-type network reaches the replay (astra.simulate), not only the formula
    other = Network("Ring", 3.0, 70000.0)
    net = replace(TRUE, per_type=(("ALL_GATHER", 3.0, 70000.0),))
    ranks = [AstraRank(r, [coll(1, pb.ALL_GATHER, 1 << 20), coll(2, pb.ALL_REDUCE, 1 << 20)]) for r in (0, 1)]
    assert simulate(ranks, {}, net).finished_ns == [collective_ns(other, pb.ALL_GATHER, 1 << 20, 2)
                                                    + collective_ns(TRUE, pb.ALL_REDUCE, 1 << 20, 2)] * 2


def test_nothing_to_fit_is_bad_input() -> None:
    ranks = [AstraRank(0, [coll(1, pb.ALL_REDUCE, 0)], source="t.0.et"), AstraRank(1, [])]
    with pytest.raises(Exception, match="no all-reduce") as exc:
        fit_network(ranks, {})
    assert type(exc.value).__name__ == "BadInput"


@pytest.fixture(scope="module")
def example_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fit") / "example"
    convert_run(example_dir(), out, jobs=1)
    return out


def test_fitted_run_of_the_bundled_example_within_5_percent(example_out: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    yml = tmp_path / "net.yml"
    assert main(["simulate", str(example_out), "--model", "astra-sim", "--network", "fitted", "--json",
                 "--write-network", str(yml)]) == 0
    data = orjson.loads(capsys.readouterr().out)
    fitted = data["runs"]["network"]["ratio_to_measured"]
    assert abs(fitted - 1) <= 0.05, fitted  # measured 0.974x
    fit = data["network_fit"]
    assert fit["samples"] == sum(t["samples"] for t in fit["by_type"].values()) > 0
    # gloo's first all-reduce (connection set-up, ~4.7 ms against ~0.25 ms later) is named as an outlier
    assert any(o["comm"] == "ALL_REDUCE" and o["measured_us"] > 4000 for o in fit["outliers"])
    # the default ring predicts the same graph much faster: what the fitted network is for
    assert main(["simulate", str(example_out), "--model", "astra-sim", "--json"]) == 0
    default = orjson.loads(capsys.readouterr().out)["runs"]["network"]["ratio_to_measured"]
    assert default < fitted - 0.2
    # the yml is ASTRA-sim's format, reads back, and replays to the same ns
    net = load_network(yml)
    assert (net.topology, net.npus_count) == ("Ring", 2)
    assert net.bandwidth_gbps == fit["bandwidth_gbps"] and net.latency_ns == fit["latency_ns"]
    assert main(["simulate", str(example_out), "--model", "astra-sim", "--json", "--network", str(yml)]) == 0
    again = orjson.loads(capsys.readouterr().out)["runs"]["network"]
    assert again["makespan_ns"] == data["runs"]["network"]["makespan_ns"]
    # and the text output names the parameters and the outliers
    assert main(["simulate", str(example_out), "--model", "astra-sim", "--network", "fitted-robust"]) == 0
    out = capsys.readouterr().out
    assert "measured transfer times:" in out and "outlier: rank 0 node" in out


def test_bad_fitted_cases_exit_2_with_one_line(example_out: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one"
    one.mkdir()
    rank0 = sorted(example_out.glob("*.et"))[0]
    # one rank of the example replayed alone: its sends have no peer, but its collectives still fit
    assert main(["simulate", str(rank0), "--model", "astra-sim", "--network", "fitted"]) == 0
    capsys.readouterr()
    yml = tmp_path / "x.yml"
    for argv in (["--network", "fitted-per-type", "--write-network", str(yml)],  # no ASTRA-sim form
                 ["--write-network", str(yml), "--network", str(tmp_path / "missing.yml")]):
        assert main(["simulate", str(example_out), "--model", "astra-sim", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, argv
        assert not yml.exists() and not yml.with_name("x.yml.tmp").exists()
    assert main(["simulate", str(example_out), "--write-network", str(yml)]) == 2  # only with astra-sim
    assert "only read with --model astra-sim" in capsys.readouterr().err


@pytest.mark.parametrize("run", ["cpu-gloo/dist_ddp_w2", "cpu-gloo/dist_fsdp1_w2"])
def test_fitted_run_of_the_gloo_runs_within_5_percent(run: str, traces: Path, tmp_path: Path) -> None:
    # measured 1.025x and 0.964x (the default ring: 0.903x and 0.843x)
    convert_run(traces / run, tmp_path, jobs=1)
    files = sorted(tmp_path.glob("*.et"))
    ranks, groups = load_for_astra(files), load_comm_group(tmp_path / "comm_group.json")
    span = measured_span_us(ranks)
    assert span
    fit = fit_network(ranks, groups)
    fitted = simulate(ranks, groups, fit.network).makespan_ns / 1000 / span
    default = simulate(ranks, groups).makespan_ns / 1000 / span
    assert abs(fitted - 1) <= 0.05, fitted
    assert abs(fitted - 1) < abs(default - 1)
    # every sample is either explained within 3 robust scales or listed
    big = [i for i, r in enumerate(fit.residual_ns) if abs(r) > 3 * max(fit.scale_ns, 1000)]
    assert big == fit.outliers


def test_one_shape_fits_the_latency_only_and_says_so() -> None:
    # every sample the same type and size: latency and bandwidth cannot be told apart
    ranks = [AstraRank(0, [replace(coll(i, pb.ALL_REDUCE, 4096), duration_us=100 + i) for i in (1, 2, 3)]),
             AstraRank(1, [])]
    fit = fit_network(ranks, {})
    assert fit.network.bandwidth_gbps == 50.0
    assert any("cannot be told apart" in n for n in fit.notes)
    assert sum(fit.residual_ns) == pytest.approx(0, abs=1e-6)  # the latency alone fits the mean time
    assert collective_ns(fit.network, pb.ALL_REDUCE, 4096, 2) == pytest.approx(102_000, abs=1)
