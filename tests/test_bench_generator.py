"""bench.scale: a K=2 scaled gpu/linear pair is the base twice over, copies kept apart, and still converts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.scale import ScaledPair, load_json, scale
from etweave.convert import convert
from etweave.report import reconciles

GPU = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME = {"cuda_runtime", "cuda_driver"}
ID_ARGS = ("External id", "correlation", "Sequence number", "Ev Idx")


@pytest.fixture(scope="module")
def base(traces: Path) -> tuple[Path, Path]:
    d = traces / "gpu" / "linear"
    for f in ("host.json.gz", "kineto.json.gz"):
        if not (d / f).is_file():
            pytest.fail(f"missing base trace {d / f}")
    return d / "host.json.gz", d / "kineto.json.gz"


@pytest.fixture(scope="module")
def scaled(base: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> ScaledPair:
    return scale(tmp_path_factory.mktemp("scaled"), k=2, base=base)


@pytest.fixture(scope="module")
def copies(base: tuple[Path, Path], scaled: ScaledPair) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(copy 0, copy 1) of the scaled Kineto events: copy 0 is the base verbatim, copy 1 the rest."""
    n = len(load_json(base[1])["traceEvents"])
    events = load_json(scaled.kineto)["traceEvents"]
    return events[:n], events[n:]


def _gpu(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU]


def test_twice_the_gpu_events(base: tuple[Path, Path], scaled: ScaledPair,
                              copies: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    base_gpu = len(_gpu(load_json(base[1])["traceEvents"]))
    assert base_gpu > 0
    assert len(_gpu(copies[0])) == len(_gpu(copies[1])) == base_gpu
    assert scaled.k == 2
    assert not any(e.get("ph") == "M" for e in copies[1]), "metadata events are written once"


def test_ids_do_not_collide(copies: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    def ids(events: list[dict[str, Any]], key: str) -> set[Any]:
        return {e["args"][key] for e in events if key in e.get("args", {})}

    for key in ID_ARGS:
        first, second = ids(copies[0], key), ids(copies[1], key)
        assert first and len(second) == len(first), key
        assert not first & second, f"{key} collides between copies"
    flows = [{e["id"] for e in c if e.get("ph") in ("s", "f") and "id" in e} for c in copies]
    assert flows[0] and not flows[0] & flows[1]


def test_correlations_stay_in_their_copy(copies: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    copy_of: dict[Any, int] = {}
    for c, events in enumerate(copies):
        for e in events:
            if e.get("ph") == "X" and e.get("cat") in RUNTIME and "correlation" in e.get("args", {}):
                copy_of[e["args"]["correlation"]] = c
    linked = Counter()
    for c, events in enumerate(copies):
        for e in _gpu(events):
            corr = e.get("args", {}).get("correlation")
            if corr in copy_of:
                assert copy_of[corr] == c, f"{e['name']} of copy {c} launched from copy {copy_of[corr]}"
                linked[c] += 1
    assert linked[0] > 0 and linked[0] == linked[1]
    # flow arrows keep pairing a runtime call with its GPU event inside one copy
    for events in copies:
        starts = {e["id"] for e in events if e.get("ph") == "s"}
        ends = {e["id"] for e in events if e.get("ph") == "f"}
        assert starts and starts <= ends


def test_copy1_after_copy0(copies: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    def timed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]

    end0 = max(e["ts"] + (e.get("dur") or 0) for e in timed(copies[0]))
    assert min(e["ts"] for e in timed(copies[1])) > end0


def test_host_kept_and_converts(base: tuple[Path, Path], scaled: ScaledPair, tmp_path: Path) -> None:
    assert load_json(scaled.host)["nodes"] == load_json(base[0])["nodes"]  # "single": the host ET unchanged
    result = convert(scaled.host, scaled.kineto, tmp_path / "out.et", tmp_path / "report.json")
    report = result.report
    assert reconciles(report) == []
    assert reconciles(load_json(tmp_path / "report.json")) == []
    assert report["host_ops"]["input"] == report["host_ops"]["output"] == scaled.host_nodes
    assert report["device_ops"]["input"] == 2 * len(_gpu(load_json(base[1])["traceEvents"]))
    assert report["device_ops"]["output"] > 0


def test_replicated_host_ids(base: tuple[Path, Path], tmp_path: Path) -> None:
    pair = scale(tmp_path, k=2, base=base, host_mode="replicate")
    nodes = load_json(base[0])["nodes"]
    out = load_json(pair.host)["nodes"]
    roots = [n for n in nodes if n["name"].startswith(("[pytorch|", "## process_group"))]
    assert len(out) == 2 * len(nodes) - len(roots), "roots are written once"
    ids = [n["id"] for n in out]
    assert len(set(ids)) == len(ids)
    base_ids, out_ids = {n["id"] for n in nodes}, set(ids)

    def missing(ns: list[dict[str, Any]], present: set[int]) -> int:
        return sum(n["parent"] not in present for n in ns)

    # every parent found in the base is found in each copy: orphans stay orphans, nothing new dangles
    body = [n for n in nodes if n not in roots]
    assert missing(out, out_ids) == 2 * missing(body, base_ids) + missing(roots, base_ids)
    seq = sorted(n["seq_id"] for n in out if n["seq_id"] >= 0)
    assert len(set(seq)) == len(set(n["seq_id"] for n in nodes if n["seq_id"] >= 0)) * 2
