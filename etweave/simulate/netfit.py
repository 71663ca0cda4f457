"""A network fitted to the measured run: the latency per hop and the bandwidth of ASTRA-sim's analytical ring that
best reproduce the run's measured transfer times, so `simulate --model astra-sim --network fitted` asks "does the
graph reproduce the run under ASTRA-sim's rules" and what-ifs relative to the real cluster.

Every formula of `network.py` is linear in (latency L, ns per byte S): a collective of the ring takes
`4 × steps × (hops × L + msg × S + 10)` ns, a send `hops × L + bytes × S`. Each sample is a network-timed node
(ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL with comm_size > 0, and sends with their peer among the
NPUs) with the duration the durations run gives it: `duration_micros`, which after `convert-run` is the transfer
time (attr `transfer_duration_micros`), else the measured duration.

The fit (`fitted`) is least squares on the residuals in ns: every transfer counts in full, so the total time is
roughly kept (exactly, per type, when the latency is not at its bound), which lets the replay reproduce the
measured span when the times are not a function of size (gloo).
`robust` (`fitted-robust`) minimizes the Huber loss instead (iteratively reweighted least squares, scale from
the median absolute deviation), so a few collectives far from the rest (gloo's first all-reduce, which sets up
connections) do not set the parameters. `per_type` fits one pair per collective type and one for sends. Either
way the samples whose residual exceeds OUTLIER_SCALES robust scales are listed, with their error, as outliers.
L ≥ 0 and the bandwidth ≤ MAX_BANDWIDTH_GBPS (a fit that wants faster is clamped there and says so). When every
sample has the same shape (one size, one type), latency and bandwidth cannot be told apart: the bandwidth stays
the default network's and only the latency is fitted (said in the notes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
from msgspec import field
from msgspec.structs import replace

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import comm_type_name
from etweave.errors import BadInput
from etweave.output import write_atomic
from etweave.simulate.astra import ALL_NPUS_PGS, AstraRank
from etweave.simulate.network import (
    DATASET_SPLITS,
    DEFAULT_NETWORK,
    ENDPOINT_DELAY_NS,
    NETWORK_TIMED,
    Network,
    hops,
    ring_schedule,
    step_hops,
)

HUBER_K = 1.345  # the usual 95%-efficiency tuning constant, in robust scales
OUTLIER_SCALES = 3.0
MAX_BANDWIDTH_GBPS = 1e6  # a fit wanting a faster network (zero serialization time) is clamped here
_IRLS_ROUNDS = 50


class Sample(msgspec.Struct, frozen=True):
    """One network-timed node: measured ns = a·L + b·S + c (L latency ns/hop, S ns per byte)."""
    rank: int
    node_id: int
    name: str
    comm: str  # ALL_REDUCE, ..., SEND
    comm_size: int
    group_size: int
    measured_ns: int
    a: float
    b: float
    c: float

    def predicted_ns(self, latency_ns: float, ns_per_byte: float) -> float:
        return self.a * latency_ns + self.b * ns_per_byte + self.c


class NetworkFit(msgspec.Struct):
    network: Network
    samples: list[Sample]
    residual_ns: list[float]  # fitted − measured, per sample
    scale_ns: float  # robust scale of the residuals (1.4826 × MAD)
    outliers: list[int]  # sample indices
    notes: list[str] = field(default_factory=list)

    def by_type(self) -> dict[str, dict[str, float | int]]:
        """Per collective type: samples, summed measured and fitted µs, RMS and largest absolute residual (µs)."""
        rows: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(self.samples):
            rows[s.comm].append(i)
        out: dict[str, dict[str, float | int]] = {}
        for comm, idx in sorted(rows.items()):
            res = [self.residual_ns[i] for i in idx]
            measured = sum(self.samples[i].measured_ns for i in idx)
            out[comm] = {"samples": len(idx), "measured_us": round(measured / 1000, 1),
                         "fitted_us": round((measured + sum(res)) / 1000, 1),
                         "rms_residual_us": round(math.sqrt(sum(r * r for r in res) / len(res)) / 1000, 1),
                         "max_abs_residual_us": round(max(abs(r) for r in res) / 1000, 1)}
        return out

    def summary(self) -> dict[str, object]:
        """JSON-able: the parameters, the residuals per type and every outlier with its error."""
        return {
            "topology": self.network.topology, "bandwidth_gbps": self.network.bandwidth_gbps,
            "latency_ns": self.network.latency_ns, "samples": len(self.samples),
            "per_type": {c: {"bandwidth_gbps": b, "latency_ns": lat} for c, b, lat in self.network.per_type},
            "robust_scale_us": round(self.scale_ns / 1000, 1),
            "by_type": self.by_type(),
            "outliers": [{"rank": s.rank, "node": s.node_id, "name": s.name, "comm": s.comm,
                          "comm_size": s.comm_size, "measured_us": round(s.measured_ns / 1000, 1),
                          "fitted_us": round((s.measured_ns + self.residual_ns[i]) / 1000, 1)}
                         for i in self.outliers for s in [self.samples[i]]],
            "notes": self.notes,
        }


def _coefficients(net_topology: str, comm_type: int, comm_size: int, p: int) -> tuple[float, float, float]:
    """(a, b, c) of `network.collective_ns` for this collective: its time is a·L + b·S + c before rounding."""
    steps, msg = ring_schedule(comm_type, comm_size, p)
    hop_count = step_hops(net_topology)
    n = DATASET_SPLITS * steps
    return n * hop_count, n * max(1, math.floor(msg)), n * ENDPOINT_DELAY_NS


def samples_of(ranks: Sequence[AstraRank], groups: Mapping[str, Sequence[int]], topology: str = "Ring") -> list[Sample]:
    """The network-timed nodes of `ranks` (`astra.AstraRank`s) with their durations, as the model would time them.
    A trace replayed as several NPUs counts once (its replicas are the same nodes)."""
    rank_list = list(ranks)
    npus = len(rank_list)
    given = {rg.rank for rg in rank_list}
    seen: set[int] = set()
    out: list[Sample] = []
    probe = Network(topology, 1.0, 0.0)
    for rg in rank_list:
        if id(rg.nodes) in seen:
            continue
        seen.add(id(rg.nodes))
        for nd in rg.nodes:
            if nd.comm_size <= 0:
                continue
            measured = nd.duration_us * 1000
            if nd.type == pb.COMM_COLL_NODE and nd.comm_type in NETWORK_TIMED:
                members = groups.get(nd.pg)
                p = npus if nd.pg in ALL_NPUS_PGS or members is None else len([r for r in members if r in given])
                if p <= 1:
                    continue
                a, b, c = _coefficients(topology, nd.comm_type, nd.comm_size, p)
                comm = comm_type_name(nd.comm_type)
            elif (nd.type == pb.COMM_SEND_NODE and not rg.replica and nd.comm_src is not None
                  and nd.comm_dst in given and nd.comm_src != nd.comm_dst):
                a, b, c, p = float(hops(probe, nd.comm_src, nd.comm_dst, npus)), float(nd.comm_size), 0.0, 2
                comm = "SEND"
            else:
                continue
            out.append(Sample(rg.rank, nd.id, nd.name, comm, nd.comm_size, p, measured, a, b, c))
    return out


def _weighted_ls(samples: Sequence[Sample], w: Sequence[float], fix_s: float | None = None,
                 fix_l: float | None = None) -> tuple[float, float] | None:
    """Weighted least squares for (L, S) with at most one of them fixed; None when singular."""
    saa = sab = sbb = say = sby = 0.0
    for s, wi in zip(samples, w, strict=True):
        y = s.measured_ns - s.c
        if fix_s is not None:
            y -= s.b * fix_s
        if fix_l is not None:
            y -= s.a * fix_l
        saa += wi * s.a * s.a
        sab += wi * s.a * s.b
        sbb += wi * s.b * s.b
        say += wi * s.a * y
        sby += wi * s.b * y
    if fix_s is not None:
        return (say / saa, fix_s) if saa > 0 else None
    if fix_l is not None:
        return (fix_l, sby / sbb) if sbb > 0 else None
    det = saa * sbb - sab * sab
    if det <= 1e-12 * saa * sbb:
        return None
    return (sbb * say - sab * sby) / det, (saa * sby - sab * say) / det


def _bounded_ls(samples: Sequence[Sample], w: Sequence[float], s_min: float, s_default: float,
                notes: set[str]) -> tuple[float, float]:
    """(L, S) minimizing the weighted squares with L ≥ 0 and S ≥ s_min (both bounds tried when one is broken)."""
    sol = _weighted_ls(samples, w)
    if sol is None:
        notes.add("every sample has the same shape: latency and bandwidth cannot be told apart, so the bandwidth is "
                  f"the default network's ({DEFAULT_NETWORK.bandwidth_gbps:g} GB/s) and only the latency is fitted")
        sol = _weighted_ls(samples, w, fix_s=s_default) or (0.0, s_default)
    lat, spb = sol
    if lat >= 0 and spb >= s_min:
        return lat, spb

    def sse(x: tuple[float, float]) -> float:
        return sum(wi * (s.predicted_ns(*x) - s.measured_ns) ** 2 for s, wi in zip(samples, w, strict=True))

    candidates = []
    for cand in (_weighted_ls(samples, w, fix_l=0.0), _weighted_ls(samples, w, fix_s=s_min)):
        if cand is not None:
            candidates.append((max(0.0, cand[0]), max(s_min, cand[1])))
    candidates.append((0.0, s_min))
    return min(candidates, key=sse)


def fit_network(ranks: Sequence[AstraRank], groups: Mapping[str, Sequence[int]], topology: str = "Ring",
                source: str = "fitted", robust: bool = False, per_type: bool = False) -> NetworkFit:
    """The 1-D `topology` network whose latency and bandwidth best reproduce the run's network-timed nodes."""
    samples = samples_of(ranks, groups, topology)
    if not samples:
        where = ", ".join(sorted({str(rg.source) for rg in ranks})) or "the traces"
        raise BadInput(where, "--network fitted: no all-reduce, all-gather, reduce-scatter, all-to-all or send with "
                              "comm_size > 0 to fit a network to")
    return fit_samples(samples, topology, source, npus=len(list(ranks)), robust=robust, per_type=per_type)


def fit_samples(samples: Sequence[Sample], topology: str = "Ring", source: str = "fitted",
                npus: int | None = None, robust: bool = False, per_type: bool = False) -> NetworkFit:
    """One (latency, bandwidth) pair for all samples, or with `per_type` one per collective type (and "SEND")."""
    notes: set[str] = set()
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.comm if per_type else ""].append(i)
    res = [0.0] * len(samples)
    pairs: list[tuple[str, float, float]] = []
    for comm, idx in sorted(groups.items()):
        group = [samples[i] for i in idx]
        group_notes: set[str] = set()
        lat, spb = _fit_pair(group, robust, group_notes)
        notes.update(f"{comm}: {n}" if comm else n for n in group_notes)
        pairs.append((comm, _round_sig(1e9 / (spb * (1 << 30))), _round_sig(lat)))
        for i, s in zip(idx, group, strict=True):
            res[i] = s.predicted_ns(lat, spb) - s.measured_ns
    scale = _robust_scale(res)
    outliers = [i for i, r in enumerate(res) if abs(r) > OUTLIER_SCALES * max(scale, 1000.0)]  # ≥ 1 µs: µs data
    if per_type:  # the pair of the type with the most samples stands for the others (none: every type has its own)
        main = max(pairs, key=lambda p: len(groups[p[0]]))
        net = Network(topology, main[1], main[2], source=source, npus_count=npus, per_type=tuple(pairs))
    else:
        net = Network(topology, pairs[0][1], pairs[0][2], source=source, npus_count=npus)
    return NetworkFit(net, list(samples), res, scale, outliers, sorted(notes))


def _fit_pair(samples: Sequence[Sample], robust: bool, notes: set[str]) -> tuple[float, float]:
    """(latency ns, ns per byte): bounded least squares, then Huber IRLS when `robust`."""
    s_min = 1e9 / (MAX_BANDWIDTH_GBPS * (1 << 30))
    s_default = 1 / DEFAULT_NETWORK.bytes_per_ns
    w = [1.0] * len(samples)
    lat, spb = _bounded_ls(samples, w, s_min, s_default, notes)
    for _ in range(_IRLS_ROUNDS if robust else 0):  # Huber IRLS: weight 1 inside k scales, k·scale/|r| outside
        res = [s.predicted_ns(lat, spb) - s.measured_ns for s in samples]
        scale = _robust_scale(res)
        if scale <= 0:
            break
        cut = HUBER_K * scale
        w = [1.0 if abs(r) <= cut else cut / abs(r) for r in res]
        new = _bounded_ls(samples, w, s_min, s_default, notes)
        done = abs(new[0] - lat) <= 1e-9 * max(1.0, abs(lat)) and abs(new[1] - spb) <= 1e-12 * max(1.0, abs(spb))
        lat, spb = new
        if done:
            break
    if spb <= s_min * (1 + 1e-9):
        notes.add(f"the fit wants no serialization time: bandwidth clamped at {MAX_BANDWIDTH_GBPS:g} GB/s")
    return lat, spb


def _robust_scale(res: Sequence[float]) -> float:
    med = _median(res)
    return 1.4826 * _median([abs(r - med) for r in res])


def _median(xs: Sequence[float]) -> float:
    v = sorted(xs)
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def _round_sig(x: float, digits: int = 9) -> float:
    """9 significant digits: what the yml keeps, so the network written and the one simulated are the same."""
    return float(f"{x:.{digits}g}")


def network_yml(net: Network, npus: int, fit: NetworkFit | None = None) -> str:
    """ASTRA-sim's analytical network config (the format of ../shared/astra-sim/configs/ring_2npus.yml)."""
    head = ["# written by etweave: " + (f"fitted to {len(fit.samples)} measured transfer times "
                                        f"(robust scale {fit.scale_ns / 1000:.1f} us, {len(fit.outliers)} outliers)"
                                        if fit else net.describe())]
    return "\n".join([*head, f"topology: [ {net.topology} ]", f"npus_count: [ {npus} ]",
                      f"bandwidth: [ {net.bandwidth_gbps!r} ]  # GB/s", f"latency: [ {net.latency_ns!r} ]  # ns", ""])


def write_network_yml(path: Path, net: Network, npus: int, fit: NetworkFit | None = None) -> None:
    """Written whole or not at all (etweave.output.write_atomic)."""
    if net.per_type:
        raise BadInput(path, "a network fitted per collective type has no ASTRA-sim config (it takes one latency "
                             "and bandwidth): write --network fitted or fitted-robust")
    write_atomic(Path(path), network_yml(replace(net, npus_count=npus), npus, fit).encode())
