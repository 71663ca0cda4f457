"""What one conversion holds, stage by stage: the process's RSS and peak RSS after reading, after each of
`etweave.convert.STAGES`, after encoding the nodes and after their self-check, run as `etweave convert` runs them
(the traces handed over, the cyclic collector off); with `--traced`, tracemalloc's largest holders by line too
(several times slower, and its own memory in the RSS).

    python -m bench.stage_memory [--host HOST_ET] [--device KINETO] [--traced] [--top N]

Default: the Kineto-only trace `kineto-only/allreduce-2020` of the shared traces. Linux only (reads
/proc/self/status).
"""

from __future__ import annotations

import argparse
import tracemalloc
from pathlib import Path

from bench.scale import traces_dir


def _status() -> str:
    """The peak RSS and RSS now, MB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                fields[key] = int(value.split()[0]) // 1024
    return f"peak {fields['VmHWM']:4d} MB  rss {fields['VmRSS']:4d} MB"


def _report(label: str, top: int) -> None:
    print(f"{label:22s} {_status()}", flush=True)
    if not tracemalloc.is_tracing():
        return
    current, peak = tracemalloc.get_traced_memory()
    print(f"{'':22s} traced {current / 1e6:.1f} MB, {peak / 1e6:.1f} MB at most since the last line")
    for stat in tracemalloc.take_snapshot().statistics("lineno")[:top]:
        frame = stat.traceback[0]
        print(f"{'':26s}{stat.size / 1e6:7.1f} MB {stat.count:9d} blocks  {frame.filename}:{frame.lineno}")
    tracemalloc.reset_peak()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", type=Path, help="a host ET")
    parser.add_argument("--device", type=Path, help="a Kineto trace")
    parser.add_argument("--traced", action="store_true", help="tracemalloc's largest holders after each stage")
    parser.add_argument("--top", type=int, default=8, help="holders listed per stage with --traced")
    args = parser.parse_args(argv)
    host, device = args.host, args.device
    if host is None and device is None:
        device = traces_dir() / "kineto-only" / "allreduce-2020.json.gz"
    if args.traced:
        tracemalloc.start()
    try:
        return _run(host, device, args.top)
    finally:
        tracemalloc.stop()  # (a caller in the same process runs untraced after it)


def _run(host: Path | None, device: Path | None, top: int) -> int:
    # (imported here: with --traced, what the modules hold is traced too)
    from etweave import convert
    from etweave.conversion import Conversion
    from etweave.nodes import encode_nodes
    from etweave.nogc import no_gc
    from etweave.read.host_et import read_host_et
    from etweave.read.kineto import read_kineto

    with no_gc():
        _report("start", top)
        host_trace = read_host_et(host) if host is not None else None
        kineto = read_kineto(device) if device is not None else None
        _report("read", top)
        c = Conversion.start(host_trace, kineto)
        c.inputs_handed_over = True  # as `etweave convert`: what only assemble reads is let go there
        del host_trace, kineto
        for stage in convert.STAGES:
            stage.run(c)
            _report(stage.name, top)
        result = convert.Result.of(c)
        del c  # (as `convert_files` returns: the result holds what encoding reads)
        nodes = encode_nodes(result.graph, result.deps, result.roofline, result.times)
        size = sum(map(len, nodes))
        _report(f"encoded ({size >> 20} MiB)", top)
        for _ in result._self_check(nodes):  # (what `Result.encoded_nodes` chains after the last node)
            pass
        _report("self-checked", top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
