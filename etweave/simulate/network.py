"""ASTRA-sim's analytical network, as a formula: how long a collective or a send takes, from its size alone.

What it mirrors (ASTRA-sim HEAD 518bd513 with astra-network-analytical, congestion-unaware; the system config
`../shared/astra-sim/configs/system_replay.json`):

- A message of B bytes between two NPUs takes `hops × latency + B / bandwidth` ns (`BasicTopology::send`),
  bandwidth converted from GB/s to bytes/ns as GiB (`bw_GBps_to_Bpns`: × 2^30 / 10^9). Hops: the shorter way
  round a bidirectional ring; 2 through a switch (NPU → switch → NPU).
- A collective is cut into `preferred-dataset-splits` (4) chunks that go through the one network dimension one
  after another (`active-chunks-per-dimension` 1). Each chunk runs the ring algorithm (`Ring.cc`: every
  collective implementation in the config is "ring"): `steps` neighbour-to-neighbour messages one after another,
  each paying the message time and the system's `endpoint-delay` (10 ns):
  ALL_REDUCE 2(p-1) steps of chunk/p bytes, REDUCE_SCATTER p-1 of chunk/p, ALL_GATHER p-1 of chunk (comm_size is
  the per-rank input), ALL_TO_ALL p(p-1)/2 of chunk/p.
- `comm_size` 0 is free (ASTRA-sim completes it at once).

This leaves out the memory-bus hops of the system layer (local-mem-bw 1600 GB/s: under 1% of a step at these
sizes) and congestion; `etweave simulate --model astra-sim` says so in its help.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import msgspec

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.accepts import SIZE_TIMED_COLLECTIVES, comm_type_name
from etweave.errors import BadInput

# system_replay.json: the system layer's knobs that the formula uses
DATASET_SPLITS = 4
ENDPOINT_DELAY_NS = 10

# Collectives the network times from comm_size; BROADCAST is replayed from its duration (docs/FACTS.md §A4)
NETWORK_TIMED = SIZE_TIMED_COLLECTIVES  # their one home: etweave.chakra.accepts
TOPOLOGIES = ("Ring", "Switch")


class Network(msgspec.Struct, frozen=True):
    topology: str  # "Ring" or "Switch"
    bandwidth_gbps: float  # GB/s per link, as ASTRA-sim's network yml gives it
    latency_ns: float  # per hop
    source: str = "default"  # the file it came from, for the output
    npus_count: int | None = None  # as the file says; ASTRA-sim needs it to equal the number of NPUs replayed
    # (comm name, bandwidth GB/s, latency ns) overriding the pair for that collective type ("SEND" for sends):
    # etweave's per-type fit (`netfit`); ASTRA-sim's config has one pair, so no yml gives or takes these
    per_type: tuple[tuple[str, float, float], ...] = ()

    @property
    def bytes_per_ns(self) -> float:
        return self.bandwidth_gbps * (1 << 30) / 1e9

    def describe(self) -> str:
        if self.per_type:
            pairs = "; ".join(f"{c} {b:g} GB/s {lat:g} ns" for c, b, lat in self.per_type)
            return f"{self.topology} per collective type: {pairs} ({self.source})"
        return f"{self.topology}, {self.bandwidth_gbps:g} GB/s, {self.latency_ns:g} ns ({self.source})"

    def for_type(self, comm: str) -> Network:
        """The network one collective type (or "SEND") sees: its per-type pair where there is one."""
        for c, bandwidth, latency in self.per_type:
            if c == comm:
                return Network(self.topology, bandwidth, latency, self.source, self.npus_count)
        return self


DEFAULT_NETWORK = Network("Ring", 50.0, 500.0)  # ../shared/astra-sim/configs/ring_*npus.yml


def hops(net: Network, src: int, dst: int, npus: int) -> int:
    """Links a message crosses from NPU `src` to NPU `dst` among `npus`."""
    if net.topology == "Switch":
        return 2
    clockwise = (dst - src) % npus
    return max(1, min(clockwise, npus - clockwise))


def message_ns(net: Network, size: int, hop_count: int = 1) -> float:
    """`BasicTopology::compute_communication_delay`: link delay plus serialization, once."""
    return hop_count * net.latency_ns + size / net.bytes_per_ns


def collective_ns(net: Network, comm_type: int, comm_size: int, group_size: int) -> int:
    """ns a network-timed collective takes once every member has issued it (see the module docstring)."""
    if comm_size <= 0 or group_size <= 1:
        return 0
    if net.per_type:
        net = net.for_type(comm_type_name(comm_type))
    steps, msg = ring_schedule(comm_type, comm_size, group_size)
    step = message_ns(net, max(1, math.floor(msg)), step_hops(net.topology)) + ENDPOINT_DELAY_NS
    return round(DATASET_SPLITS * steps * step)


def ring_schedule(comm_type: int, comm_size: int, group_size: int) -> tuple[int, float]:
    """(steps per chunk, bytes per step) of a network-timed collective of `group_size` NPUs: the one home of the
    ring algorithm's shape, used by the replay and by the network fit (netfit.py)."""
    p = group_size
    chunk = comm_size / DATASET_SPLITS
    if comm_type == pb.ALL_REDUCE:
        return 2 * (p - 1), chunk / p
    if comm_type == pb.REDUCE_SCATTER:
        return p - 1, chunk / p
    if comm_type == pb.ALL_GATHER:
        return p - 1, chunk
    if comm_type == pb.ALL_TO_ALL:
        return p * (p - 1) // 2, chunk / p
    raise ValueError(f"comm_type {comm_type} is not timed by the network")


def step_hops(topology: str) -> int:
    return 2 if topology == "Switch" else 1  # a ring step goes to the neighbour; a switch step through the switch


def send_ns(net: Network, comm_size: int, src: int, dst: int, npus: int) -> int:
    """ns from a send's issue until its message has arrived at `dst`."""
    if comm_size <= 0 or src == dst:
        return 0
    if net.per_type:
        net = net.for_type("SEND")
    return round(message_ns(net, comm_size, hops(net, src, dst, npus)))


_LINE = re.compile(r"^\s*([A-Za-z_]+)\s*:\s*\[?\s*([^\]#]*?)\s*\]?\s*(#.*)?$")


def load_network(path: Path) -> Network:
    """An ASTRA-sim analytical network yml of one dimension (`topology: [ Ring ]`, `bandwidth: [ 50.0 ]`, ...)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BadInput(path, f"cannot read: {exc.strerror}") from exc
    fields = _config_fields(path, text)
    for key in ("topology", "bandwidth", "latency"):
        if key not in fields:
            raise BadInput(path, f"no {key!r}: expected an ASTRA-sim analytical network config")
        if "," in fields[key]:
            raise BadInput(path, f"{key}: more than one dimension; only 1-D Ring or Switch networks are modelled")
    topology = fields["topology"].strip().strip("'\"")
    if topology not in TOPOLOGIES:
        raise BadInput(path, f"topology {topology!r}: only {' and '.join(TOPOLOGIES)} are modelled")
    try:
        bandwidth, latency = float(fields["bandwidth"]), float(fields["latency"])
    except ValueError as exc:
        raise BadInput(path, f"bandwidth and latency must be numbers: {exc}") from exc
    if not bandwidth > 0 or not latency >= 0:
        raise BadInput(path, "bandwidth must be > 0 and latency >= 0")
    npus_count = None
    if "npus_count" in fields:
        try:
            npus_count = int(fields["npus_count"])
        except ValueError as exc:
            raise BadInput(path, f"npus_count must be an integer: {exc}") from exc
    return Network(topology, bandwidth, latency, source=Path(path).name, npus_count=npus_count)


def _config_fields(path: Path, text: str) -> dict[str, str]:
    """`key: [ value ]` lines of a network yml: key -> the value text (blank and comment lines skipped)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise BadInput(path, f"not a network config line: {line.strip()!r}")
        fields[m.group(1)] = m.group(2)
    return fields
