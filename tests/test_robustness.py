"""Bad input: one clear line, exit 2, nothing written. Tolerable input: accepted, each oddity counted.
Every row of docs/ERRORS.md is one case here."""

from __future__ import annotations

import gzip
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from conftest import load_gz
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etweave.check import check_nodes
from etweave.convert import run_pipeline
from etweave.errors import BadInput
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto
from etweave.report import reconciles

PAIR = "gpu/simple-add"
GLOO = "cpu-gloo/dist_ddp_w2/rank0"

settings.register_profile("ci", max_examples=15, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("long", max_examples=1500, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(os.environ.get("ETWEAVE_HYPOTHESIS_PROFILE", "ci"))


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etweave", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def _host(traces: Path, rel: str = PAIR) -> dict:
    return load_gz(traces / rel / "host.json.gz")


def _kineto(traces: Path, rel: str = PAIR) -> dict:
    return load_gz(traces / rel / "kineto.json.gz")


def _raw(tmp: Path, name: str, data: bytes) -> Path:
    p = tmp / name
    p.write_bytes(data)
    return p


def _json(tmp: Path, name: str, doc: object) -> Path:
    return _raw(tmp, name, orjson.dumps(doc))


def _host_dup(t: Path, tmp: Path) -> Path:
    doc = _host(t)
    doc["nodes"].append(dict(doc["nodes"][3]))
    return _json(tmp, "host.json", doc)


def _host_no_id(t: Path, tmp: Path) -> Path:
    doc = _host(t)
    doc["nodes"][2] = {"label": "x"}
    return _json(tmp, "host.json", doc)


def _kineto_bad_type(t: Path, tmp: Path) -> Path:
    doc = _kineto(t)
    doc["traceEvents"][5]["ts"] = "soon"
    return _json(tmp, "kineto.json", doc)


def _bomb(t: Path, tmp: Path) -> Path:
    return _raw(tmp, "host.json.gz", gzip.compress(b" " * (4 << 20)))


def _host_node(t: Path, tmp: Path, rel: str, pick: Callable[[dict], bool], change: Callable[[dict], object]) -> Path:
    """The host ET of `rel` with `change` applied to the first node `pick` accepts."""
    doc = _host(t, rel)
    change(next(n for n in doc["nodes"] if pick(n)))
    return _json(tmp, "host.json", doc)


def _set_attr(name: str, value: object) -> Callable[[dict], None]:
    def change(node: dict) -> None:
        next(a for a in node["attrs"] if a["name"] == name)["value"] = value
    return change


def _kineto_event(t: Path, tmp: Path, rel: str, pick: Callable[[dict], bool], change: Callable[[dict], object],
                  top: Callable[[dict], object] | None = None) -> Path:
    doc = _kineto(t, rel)
    change(next(e for e in doc["traceEvents"] if e.get("ph") == "X" and pick(e)))
    if top is not None:
        top(doc)
    return _json(tmp, "kineto.json", doc)


def _negative_nelems(t: Path, tmp: Path) -> Path:
    doc = load_gz(t / "kineto-only" / "nccl-broadcast-allreduce.json.gz")
    next(e for e in doc["traceEvents"] if "In msg nelems" in e.get("args", {}))["args"]["In msg nelems"] = -1
    return _json(tmp, "kineto.json", doc)


BIG = 1 << 63  # one past the largest int64
_is_send = lambda n: n["name"] == "c10d::send"  # noqa: E731
_any = lambda n: n["id"] > 5  # noqa: E731
_cpu = lambda e: e.get("cat") == "cpu_op"  # noqa: E731


def _pg_ranks(value: object) -> Callable[[dict], None]:
    def change(node: dict) -> None:
        groups = orjson.loads(node["inputs"]["values"][0])
        groups[0]["ranks"] = value
        node["inputs"]["values"][0] = orjson.dumps(groups).decode()
    return change


def _pg_field(name: str, value: object) -> Callable[[dict], None]:
    def change(node: dict) -> None:
        groups = orjson.loads(node["inputs"]["values"][0])
        groups[0][name] = value
        node["inputs"]["values"][0] = orjson.dumps(groups).decode()
    return change


# Class 1 (numbers the output cannot hold) and class 2 (malformed values) of issue 13: each was an exit 1.
WIDTHS: list[tuple[str, Callable[[Path, Path], Path], str, str]] = [
    ("host parent (ctrl_deps) >= 2^63", lambda t, d: _host_node(t, d, GLOO, _any, lambda n: n.update(ctrl_deps=BIG)),
     "--host", "'ctrl_deps' 9223372036854775808 out of range"),
    ("host parent (flat schema) >= 2^63", lambda t, d: _host_node(t, d, PAIR, _any, lambda n: n.update(parent=BIG)),
     "--host", "'parent' 9223372036854775808 out of range"),
    ("host tid >= 2^63", lambda t, d: _host_node(t, d, GLOO, _any, _set_attr("tid", BIG)), "--host",
     "'tid' 9223372036854775808 out of range"),
    ("host rf_id >= 2^63", lambda t, d: _host_node(t, d, GLOO, _any, _set_attr("rf_id", BIG)), "--host",
     "'rf_id' 9223372036854775808 out of range"),
    ("send peer above int32", lambda t, d: _host_node(
        t, d, GLOO, _is_send, lambda n: n["inputs"]["values"].__setitem__(2, 1 << 40)), "--host", "peer 1099511627776"),
    ("tensor sizes overflow comm_size", lambda t, d: _host_node(
        t, d, GLOO, _is_send, lambda n: n["inputs"]["values"][0][0].__setitem__(3, 1 << 62)), "--host",
     "collective size"),
    ("Kineto tid >= 2^63", lambda t, d: _kineto_event(t, d, GLOO, _cpu, lambda e: e.update(tid=BIG)), "--device",
     ".tid 9223372036854775808 out of range"),
    ("Kineto ts of 1e300", lambda t, d: _kineto_event(t, d, GLOO, _cpu, lambda e: e.update(ts=1e300)), "--device",
     ".ts 1e+300 out of range"),
    ("Kineto dur of 1e300", lambda t, d: _kineto_event(t, d, GLOO, _cpu, lambda e: e.update(dur=1e300)), "--device",
     ".dur 1e+300 out of range"),
    ("rank true", lambda t, d: _kineto_event(t, d, GLOO, _cpu, lambda e: None,
                                             lambda k: k["distributedInfo"].update(rank=True)),
     "--device", "distributedInfo.rank True is not a rank"),
    ("rank 2^63", lambda t, d: _kineto_event(t, d, GLOO, _cpu, lambda e: None,
                                            lambda k: k["distributedInfo"].update(rank=BIG)),
     "--device", "distributedInfo.rank 9223372036854775808 is not a rank"),
    ("world_size 1e8", lambda t, d: _kineto_event(t, d, GLOO, _cpu, lambda e: None,
                                                 lambda k: k["distributedInfo"].update(world_size=10**8)),
     "--device", "distributedInfo.world_size 100000000 is not a world size"),
    ("negative In msg nelems", _negative_nelems, "--device", "'In msg nelems' -1 is not an element count"),
    ("Kineto name with invalid UTF-8", lambda t, d: _raw(d, "kineto.json", orjson.dumps(_kineto(t)).replace(
        b'"name":"[param|cuda]"', b'"name":"\xff"')), "--device", "UTF-8"),
    ("host inputs nested 300 deep", lambda t, d: _raw(d, "host.json", _host_node(
        t, d, GLOO, _any, lambda n: n["inputs"].update(values=["NEST"], types=["Int"], shapes=[[]])).read_bytes()
        .replace(b'"NEST"', b"[" * 300 + b"]" * 300)), "--host", "'inputs' nested more than 254 levels"),
    ("attr name a list", lambda t, d: _host_node(t, d, GLOO, _any, lambda n: n["attrs"][0].update(name=[1])), "--host",
     "attrs[0] 'name' is list, not a string"),
    ("process group ranks 5", lambda t, d: _host_node(
        t, d, GLOO, lambda n: n["name"] == "## process_group:init ##", _pg_ranks(5)), "--host",
     "group 0 'ranks' is int, not a list of ranks"),
    ("process group size 1e8", lambda t, d: _host_node(
        t, d, GLOO, lambda n: n["name"] == "## process_group:init ##", _pg_field("group_size", 10**8)), "--host",
     "group 0 'group_size' 100000000 is not a world size"),
    ("process group rank -1", lambda t, d: _host_node(
        t, d, GLOO, lambda n: n["name"] == "## process_group:init ##", _pg_ranks([0, -1])), "--host",
     "'ranks' entry -1 is not a rank"),
]


@pytest.mark.parametrize("case", WIDTHS, ids=[c[0] for c in WIDTHS])
def test_out_of_range_and_malformed(traces: Path, tmp_path: Path, case: tuple) -> None:
    """Each is bad input, told once at the reader with the file and the field; nothing written."""
    _, build, flag, words = case
    bad = build(traces, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    other = "--device" if flag == "--host" else "--host"
    rel = GLOO if "In msg" not in case[0] and "UTF-8" not in case[0] else None
    pair = [other, str(traces / rel / ("kineto.json.gz" if other == "--device" else "host.json.gz"))] if rel else []
    proc = _run(["convert", flag, str(bad), *pair, "-o", str(out / "t.et"), "--report", str(out / "r.json")])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert words in proc.stderr and bad.name in proc.stderr, proc.stderr
    assert list(out.iterdir()) == []


def test_correlation_of_1e300_is_no_correlation(traces: Path, tmp_path: Path) -> None:
    """An id that no int64 holds is a corrupt field (docs/ERRORS.md): ignored, the rest converts."""
    bad = _kineto_event(traces, tmp_path, PAIR, lambda e: e.get("cat") == "cuda_runtime",
                        lambda e: e["args"].update(correlation=1e300))
    proc = _run(["convert", "--device", str(bad), "-o", str(tmp_path / "t.et"), "--quiet"])
    assert proc.returncode == 0, proc.stderr


def test_rank_folder_beyond_any_rank(traces: Path, tmp_path: Path) -> None:
    run = tmp_path / "run" / "rank9223372036854775808"
    run.mkdir(parents=True)
    (run / "kineto.json.gz").write_bytes((traces / GLOO / "kineto.json.gz").read_bytes())
    proc = _run(["convert-run", str(tmp_path / "run"), "-o", str(tmp_path / "out"), "--jobs", "1"])
    assert proc.returncode == 2 and "rank9223372036854775808" in proc.stderr and "is not a rank" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_string_thread_ids_hash_in_linear_time() -> None:
    """A 30,000-character thread id took 150 s (31**i on big integers); the value is unchanged."""
    from etweave.nodes import _tid
    assert _tid("ab") == (ord("a") + ord("b") * 31) % (1 << 31)
    long_tid = "x" * 300_000
    assert 0 <= _tid(long_tid) < 1 << 31  # quadratic would take hours here; no timing asserted


# (case, builder of the bad file, which flag gets it, words the one-line message must contain, extra env)
REJECTED: list[tuple[str, Callable[[Path, Path], Path], str, str, dict[str, str]]] = [
    ("not JSON", lambda t, d: _raw(d, "host.json", b"hello"), "--host", "not valid JSON", {}),
    ("truncated JSON", lambda t, d: _raw(d, "host.json", orjson.dumps(_host(t))[:500]), "--host",
     "not valid JSON", {}),
    ("truncated Kineto JSON", lambda t, d: _raw(d, "k.json", orjson.dumps(_kineto(t))[:900]), "--device",
     "not valid JSON", {}),
    ("top level not an object", lambda t, d: _json(d, "host.json", [1, 2]), "--host",
     "expected a JSON object", {}),
    ("nodes not a list", lambda t, d: _json(d, "host.json", {"schema": "1.0.1", "nodes": {}}), "--host",
     "'nodes' is not a list", {}),
    ("unknown schema, no node shape", _host_no_id, "--host", "unknown schema", {}),
    ("duplicate host node ids", _host_dup, "--host", "duplicate node id", {}),
    ("Kineto trace given as host ET", lambda t, d: t / PAIR / "kineto.json.gz", "--host",
     "looks like a Kineto trace", {}),
    ("host ET given as Kineto trace", lambda t, d: t / PAIR / "host.json.gz", "--device",
     "looks like a host execution trace", {}),
    ("Kineto field of the wrong type", _kineto_bad_type, "--device", "not a Kineto trace", {}),
    ("traceEvents not a list", lambda t, d: _json(d, "k.json", {"traceEvents": {"a": 1}}), "--device",
     "not a Kineto trace", {}),
    ("deeply nested JSON (host)", lambda t, d: _raw(d, "host.json", b"[" * 5000 + b"]" * 5000), "--host",
     "not valid JSON", {}),
    ("deeply nested JSON (Kineto)", lambda t, d: _raw(
        d, "k.json", b'{"traceEvents":[{"ph":"X","args":{"Input Dims":' + b"[" * 100000 + b"]" * 100000 + b"}}]}"),
     "--device", "nested too deeply", {}),
    ("enormous integer id", lambda t, d: _raw(d, "host.json", b'{"nodes":[{"id":1' + b"0" * 60 + b',"name":"a"}]}'),
     "--host", "must be an integer", {}),
    ("gzip bomb", _bomb, "--host", "byte input limit", {"ETWEAVE_MAX_INPUT_BYTES": str(1 << 20)}),
    ("corrupt gzip", lambda t, d: _raw(d, "host.json.gz", (t / PAIR / "host.json.gz").read_bytes()[:300]),
     "--host", "gzip", {}),
    ("missing file", lambda t, d: d / "nope.json", "--host", "cannot read", {}),
]


@pytest.mark.parametrize("case", REJECTED, ids=[c[0] for c in REJECTED])
def test_rejected(traces: Path, tmp_path: Path, case: tuple) -> None:
    _, build, flag, words, env = case
    bad = build(traces, tmp_path)
    out = tmp_path / "out" / "t.et"
    out.parent.mkdir()
    proc = _run(["convert", flag, str(bad), "-o", str(out), "--report", str(tmp_path / "out" / "r.json")], env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert words in proc.stderr and bad.name in proc.stderr
    assert list(out.parent.iterdir()) == [], "nothing written, not even half"


def test_no_input_given(tmp_path: Path) -> None:
    proc = _run(["convert", "-o", str(tmp_path / "t.et")])
    assert proc.returncode == 2 and "give --host, --device, or both" in proc.stderr


def _tolerated(traces: Path, tmp_path: Path, host: dict | None = None, kineto: dict | None = None,
               rel: str = PAIR) -> dict:
    h = _json(tmp_path, "h.json", host) if host is not None else traces / rel / "host.json.gz"
    k = _json(tmp_path, "k.json", kineto) if kineto is not None else traces / rel / "kineto.json.gz"
    result = run_pipeline(read_host_et(h), read_kineto(k))
    assert reconciles(result.report) == [] and check_nodes(result.nodes, "x") == []
    return result.report


def test_unknown_fields_ignored(traces: Path, tmp_path: Path) -> None:
    host, kineto = _host(traces), _kineto(traces)
    host["novel"] = {"x": 1}
    for n in host["nodes"]:
        n["future_field"] = [1, 2]
    for e in kineto["traceEvents"]:
        e["newKey"] = "v"
    assert _tolerated(traces, tmp_path, host, kineto)["warnings"] == _tolerated(traces, tmp_path)["warnings"]


def test_missing_optional_fields_defaulted(traces: Path, tmp_path: Path) -> None:
    host = _host(traces, GLOO)
    for n in host["nodes"][5:50]:
        n.pop("inputs", None)
        n.pop("outputs", None)
        n["attrs"] = [a for a in n["attrs"] if a["name"] not in ("seq_id", "scope", "op_schema")]
    report = _tolerated(traces, tmp_path, host, rel=GLOO)
    assert report["host_ops"]["output"] == len(host["nodes"])


def test_truncated_process_group_init(traces: Path, tmp_path: Path) -> None:
    host = _host(traces, GLOO)
    pg = next(n for n in host["nodes"] if n["name"] == "## process_group:init ##")
    pg["inputs"]["values"][0] = pg["inputs"]["values"][0][:40]
    assert _tolerated(traces, tmp_path, host, rel=GLOO)["warnings"]["process_group_init_truncated"] == 1


def test_duplicate_kineto_events(traces: Path, tmp_path: Path) -> None:
    kineto = _kineto(traces)
    dups = [e for e in kineto["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    kineto["traceEvents"].extend(dups)
    report = _tolerated(traces, tmp_path, kineto=kineto)
    assert report["warnings"]["duplicate_kineto_events"] == len(dups)
    assert report["device_ops"]["output"] == len(dups)


def test_ctrl_deps_cycle_broken(traces: Path, tmp_path: Path) -> None:
    host = _host(traces, GLOO)
    a, b = host["nodes"][10], host["nodes"][11]
    a["ctrl_deps"], b["ctrl_deps"] = b["id"], a["id"]
    assert _tolerated(traces, tmp_path, host, rel=GLOO)["warnings"]["host_parent_cycles_broken"] == 1


def test_ids_out_of_order(traces: Path, tmp_path: Path) -> None:
    host = _host(traces)
    random.Random(7).shuffle(host["nodes"])
    kineto = read_kineto(traces / PAIR / "kineto.json.gz")
    shuffled = run_pipeline(read_host_et(_json(tmp_path, "h.json", host)), kineto)
    plain = run_pipeline(read_host_et(traces / PAIR / "host.json.gz"), read_kineto(traces / PAIR / "kineto.json.gz"))
    assert shuffled.nodes == plain.nodes


def test_negative_and_missing_durations(traces: Path, tmp_path: Path) -> None:
    kineto = _kineto(traces)
    xs = [e for e in kineto["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    xs[3]["dur"] = -5
    del xs[4]["dur"]
    warnings = _tolerated(traces, tmp_path, kineto=kineto)["warnings"]
    assert warnings["negative_durations"] == 1 and warnings["missing_durations"] == 1


# ---- property-based: mutations that keep the shape valid are accepted, the others rejected cleanly ----

@st.composite
def shape_keeping(draw: st.DrawFn) -> tuple[str, int]:
    return draw(st.sampled_from(["delete", "drop_fields", "shuffle", "dup_events"])), draw(st.integers(0, 2**31))


@given(shape_keeping())
def test_shape_keeping_mutations_accepted(traces: Path, tmp_path: Path, mutation: tuple[str, int]) -> None:
    kind, seed = mutation
    rng = random.Random(seed)
    rel = rng.choice([PAIR, GLOO, "cpu-gloo/single_cnn/rank0"])
    host, kineto = _host(traces, rel), _kineto(traces, rel)
    nodes = host["nodes"]
    if kind == "delete":
        for _ in range(rng.randint(1, max(1, len(nodes) // 4))):
            nodes.pop(rng.randrange(len(nodes)))
    elif kind == "drop_fields":
        for n in rng.sample(nodes, k=max(1, len(nodes) // 3)):
            for key in [k for k in n if k not in ("id", "name")]:
                if rng.random() < 0.5:
                    del n[key]
    elif kind == "shuffle":
        rng.shuffle(nodes)
        rng.shuffle(kineto["traceEvents"])
    else:
        events = kineto["traceEvents"]
        events.extend(rng.sample(events, k=min(len(events), rng.randint(1, 50))))
    result = run_pipeline(read_host_et(_json(tmp_path, "h.json", host)), read_kineto(_json(tmp_path, "k.json", kineto)))
    assert reconciles(result.report) == []
    assert check_nodes(result.nodes, rel) == []
    assert {n["id"] for n in nodes} <= {n.id for n in result.nodes}


def _gzip_header_end(data: bytes) -> int:
    flags, pos = data[3], 10
    if flags & 4:  # FEXTRA
        pos += 2 + int.from_bytes(data[pos:pos + 2], "little")
    for bit in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            pos = data.index(b"\0", pos) + 1
    return pos + (2 if flags & 2 else 0)


@given(st.sampled_from(["truncate", "retype", "corrupt_gzip"]), st.integers(0, 2**31), st.booleans())
def test_shape_breaking_mutations_rejected(traces: Path, tmp_path: Path, kind: str, seed: int, host_side: bool) -> None:
    rng = random.Random(seed)
    rel = rng.choice([PAIR, GLOO])
    name = "host.json.gz" if host_side else "kineto.json.gz"
    original = (traces / rel / name).read_bytes()
    if kind == "truncate":
        raw = gzip.decompress(original)
        data = raw[: rng.randrange(1, raw.rindex(b"}"))]
    elif kind == "retype":
        doc = orjson.loads(gzip.decompress(original))
        if host_side:
            node = rng.choice(doc["nodes"])
            if rng.random() < 0.5:
                node["id"] = rng.choice([[1], {"a": 1}, None, True, "7", 1.5])
            else:
                node["name"] = rng.choice([[1], {"a": 1}, None, 7])
        else:
            ev = rng.choice([e for e in doc["traceEvents"] if "ts" in e])
            ev["ts"] = rng.choice(["x", [1], {"a": 1}])
        data = orjson.dumps(doc)
    else:
        buf = bytearray(original)
        pos = rng.randrange(_gzip_header_end(original), len(buf))  # header names and dates guard no data
        buf[pos] ^= rng.randrange(1, 256)
        data = bytes(buf)
    path = _raw(tmp_path, "mutated.json", data)
    reader = read_host_et if host_side else read_kineto
    with pytest.raises(BadInput):
        reader(path)


# ---- class 5: outputs checked before any work; all or nothing; never an input overwritten ----

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _pair_args(traces: Path, rel: str = PAIR) -> list[str]:
    return ["--host", str(traces / rel / "host.json.gz"), "--device", str(traces / rel / "kineto.json.gz")]


@pytest.mark.parametrize("where", ["missing folder", "a file as folder"])
def test_report_folder_unusable_leaves_no_et(traces: Path, tmp_path: Path, where: str) -> None:
    (tmp_path / "t.et").write_bytes(b"previous")
    (tmp_path / "afile").write_bytes(b"x")
    report = tmp_path / ("nope" if where == "missing folder" else "afile") / "r.json"
    proc = _run(["convert", *_pair_args(traces), "-o", str(tmp_path / "t.et"), "--report", str(report)])
    assert proc.returncode == 2 and str(report.parent) in proc.stderr and "folder of --report" in proc.stderr
    assert _snapshot(tmp_path) == {"afile": b"x", "t.et": b"previous"}


def test_output_equal_to_report_refused(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.et"
    proc = _run(["convert", *_pair_args(traces), "-o", str(out), "--report", str(tmp_path / "." / "x.et")])
    assert proc.returncode == 2 and "given as both -o and --report" in proc.stderr and "x.et" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_output_equal_to_input_refused(traces: Path, tmp_path: Path) -> None:
    host = tmp_path / "host.json.gz"
    host.write_bytes((traces / PAIR / "host.json.gz").read_bytes())
    before = host.read_bytes()
    proc = _run(["convert", "--host", str(host), "-o", str(tmp_path / ".." / tmp_path.name / "host.json.gz")])
    assert proc.returncode == 2 and "-o is also an input" in proc.stderr and "host.json.gz" in proc.stderr
    assert host.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["host.json.gz"]


def test_output_onto_a_device_refused(traces: Path, tmp_path: Path) -> None:
    proc = _run(["convert", *_pair_args(traces), "-o", "/dev/null"])
    assert proc.returncode == 2 and "/dev/null: -o is not a regular file" in proc.stderr
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize("target", ["existing file", "below a file"])
def test_convert_run_output_not_a_folder(traces: Path, tmp_path: Path, target: str) -> None:
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    out = afile if target == "existing file" else afile / "sub"
    proc = _run(["convert-run", str(traces / "cpu-gloo/dist_ddp_w2"), "-o", str(out), "--jobs", "1"])
    assert proc.returncode == 2 and str(afile) in proc.stderr and "not a folder" in proc.stderr, proc.stderr
    assert proc.stdout == ""  # refused before any rank was converted
    assert _snapshot(tmp_path) == {"afile": b"x"}


def test_failure_at_each_rename_changes_nothing(traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> None:
    """Inject a failure at every rename of a convert and of a convert-run write, over previous outputs: the
    folder is as before, byte for byte, with no temporary file left."""
    from etweave import run as whole_run
    from etweave.convert import convert

    real_replace = os.replace
    calls: list[int] = []

    def failing_at(k: int) -> Callable[..., None]:
        def replace(a: object, b: object) -> None:
            calls.append(1)
            if len(calls) == k:
                raise OSError(28, "No space left on device")
            real_replace(a, b)  # type: ignore[arg-type]
        return replace

    out = tmp_path / "single"
    out.mkdir()
    convert(traces / PAIR / "host.json.gz", None, out / "t.et", out / "r.json")
    (out / "r.json").write_bytes(b"older report")
    before = _snapshot(out)
    n = 0
    while True:
        n += 1
        calls.clear()
        monkeypatch.setattr(os, "replace", failing_at(n))
        try:
            convert(traces / PAIR / "host.json.gz", traces / PAIR / "kineto.json.gz", out / "t.et", out / "r.json")
        except BadInput as exc:
            assert "No space left" in str(exc) and ("t.et" in exc.where or "r.json" in exc.where)
            assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["r.json", "t.et"]
            continue
        finally:
            monkeypatch.setattr(os, "replace", real_replace)
        break
    assert n >= 4, "two targets, each moved aside and then replaced"

    # the result reads its ranks from the files convert_run wrote: write it again into a copy of that folder
    result = whole_run.convert_run(traces / "cpu-gloo/dist_ddp_w2", tmp_path / "first", jobs=1)
    run_out = tmp_path / "run"
    shutil.copytree(tmp_path / "first", run_out)
    (run_out / "trace.1.et").write_bytes(b"older rank 1")
    before = _snapshot(run_out)
    n = 0
    while True:
        n += 1
        calls.clear()
        monkeypatch.setattr(os, "replace", failing_at(n))
        try:
            whole_run.write_run(run_out, "trace", result)
        except BadInput as exc:
            assert Path(exc.where).parent == run_out and "etweave-run" not in str(exc)  # the target, not a temp
            assert _snapshot(run_out) == before and len(list(run_out.iterdir())) == 4
            continue
        finally:
            monkeypatch.setattr(os, "replace", real_replace)
        break
    assert n >= 8 and (run_out / "trace.1.et").read_bytes() != b"older rank 1"


def test_disk_full_while_writing_names_the_target(traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> None:
    """ENOSPC while a convert-run output is written: the message names that output (not a deleted staging path)
    and nothing is left."""
    import builtins

    from etweave import output
    from etweave import run as whole_run

    result = whole_run.convert_run(traces / "cpu-gloo/dist_ddp_w2", tmp_path / "first", jobs=1)
    out = tmp_path / "out"
    out.mkdir()
    real_open = builtins.open

    def full_open(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if "w" in mode and ".trace.1.et.tmp-" in str(file):
            raise OSError(28, "No space left on device")
        return real_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(output, "open", full_open, raising=False)
    with pytest.raises(BadInput) as info:
        whole_run.write_run(out, "trace", result)
    assert str(info.value) == f"{out / 'trace.1.et'}: cannot write: No space left on device"
    assert list(out.iterdir()) == []


def test_temp_cleanup_failure_keeps_the_real_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a read-only file system removing the temporary file fails too: the error reported is the write's."""
    from etweave import output

    def broken_unlink(self: Path, missing_ok: bool = False) -> None:
        raise OSError(30, "Read-only file system")

    def broken_replace(a: object, b: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", broken_unlink)
    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(BadInput, match="cannot write: Read-only file system") as info:
        output.write_atomic(tmp_path / "t.et", b"data")
    assert info.value.where == str(tmp_path / "t.et")


def test_internal_error_still_exits_1(traces: Path, tmp_path: Path) -> None:
    """No catch-all: an etweave bug (injected here) is exit 1, and leaves no output."""
    code = ("import sys, etweave.nodes as n\n"
            "def boom(*a, **k):\n    raise ZeroDivisionError('injected')\n"
            "n.encode_nodes = boom\nimport etweave.convert as c\nc.encode_nodes = boom\n"
            "from etweave.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, "convert", *_pair_args(traces), "-o", str(tmp_path / "t.et"),
                           "--report", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert proc.returncode == 1 and "internal error: ZeroDivisionError: injected" in proc.stderr
    assert list(tmp_path.iterdir()) == []


# ---- class 6 and 9: one run at a time per output folder; what killed runs left is cleaned, never a live run's ----

def test_second_run_into_a_locked_folder_refused(traces: Path, tmp_path: Path) -> None:
    from etweave.output import folder_lock

    out = tmp_path / "out"
    out.mkdir()
    with folder_lock(out):  # a run in progress
        proc = _run(["convert-run", str(traces / "cpu-gloo/dist_ddp_w2"), "-o", str(out), "--jobs", "1"])
    assert proc.returncode == 2 and "another etweave run is writing into this folder" in proc.stderr
    assert list(out.iterdir()) == []


def test_stale_temporary_files_cleaned_live_ones_kept(traces: Path, tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    (out / ".etweave-run-abc123").mkdir(parents=True)
    (out / ".etweave-run-abc123" / "trace.0.et").write_bytes(b"half")
    (out / f".trace.0.et.tmp-{dead.pid}").write_bytes(b"half")
    (out / f".report.json.tmp-{dead.pid}").write_bytes(b"half")
    live = out / f".trace.1.et.tmp-{os.getpid()}"  # this process is alive: its file is not stale
    live.write_bytes(b"in progress")
    proc = _run(["convert-run", str(traces / "cpu-gloo/dist_ddp_w2"), "-o", str(out), "--jobs", "1", "--quiet"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["comm_group.json", "report.json", "trace.0.et", "trace.1.et", live.name])


# ---- class 3: special files, pipes, gzip members, memory-derived limit ----

def _fifo(tmp: Path, name: str = "fifo.json") -> Path:
    path = tmp / name
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", ["convert", "check", "simulate", "jsonize"])
def test_fifo_without_writer_refused_not_blocking(tmp_path: Path, command: str) -> None:
    fifo = _fifo(tmp_path, "fifo.et" if command != "convert" else "fifo.json")
    args = ["convert", "--host", str(fifo), "-o", str(tmp_path / "t.et")] if command == "convert" else \
        [command, str(fifo)]
    proc = subprocess.run([sys.executable, "-m", "etweave", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ETWEAVE_PIPE_WAIT": "1"})
    assert proc.returncode == 2 and "fifo" in proc.stderr and "nothing wrote to" in proc.stderr, proc.stderr
    assert not (tmp_path / "t.et").exists()


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_devices_refused(tmp_path: Path, device: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "etweave", "convert", "--device", device, "-o",
                           str(tmp_path / "t.et")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"{device}: is not a regular file or a pipe" in proc.stderr


def test_pipes_are_read(traces: Path, tmp_path: Path) -> None:
    """--host /dev/stdin and process substitution: the same graph as from the files (names aside)."""
    host, kineto = traces / PAIR / "host.json.gz", traces / PAIR / "kineto.json.gz"
    files = _run(["convert", "--host", str(host), "--device", str(kineto), "-o", str(tmp_path / "a.et"),
                  "--report", str(tmp_path / "a.json"), "--quiet"])
    with open(host, "rb") as stdin:
        script = (f'"{sys.executable}" -m etweave convert --host /dev/stdin --device <(zcat "{kineto}") '
                  f'-o "{tmp_path / "b.et"}" --report "{tmp_path / "b.json"}" --quiet')
        piped = subprocess.run(["bash", "-c", script], stdin=stdin, capture_output=True, text=True, timeout=120)
    assert files.returncode == 0 and piped.returncode == 0, piped.stderr
    a, b = orjson.loads((tmp_path / "a.json").read_bytes()), orjson.loads((tmp_path / "b.json").read_bytes())
    assert a["nodes"] == b["nodes"] and a["edges"] == b["edges"] and a["host_ops"] == b["host_ops"]


def test_gzip_of_three_members_read_whole(traces: Path, tmp_path: Path) -> None:
    raw = gzip.decompress((traces / PAIR / "host.json.gz").read_bytes())
    third = len(raw) // 3
    members = _raw(tmp_path, "host.json.gz", b"".join(gzip.compress(raw[i:j]) for i, j in
                                                      ((0, third), (third, 2 * third), (2 * third, len(raw)))))
    assert len(read_host_et(members).ops) == len(read_host_et(traces / PAIR / "host.json.gz").ops)


def test_bomb_in_a_later_gzip_member_hits_the_limit(tmp_path: Path) -> None:
    bomb = _raw(tmp_path, "host.json.gz", gzip.compress(b'{"nodes":[') + gzip.compress(b" " * (8 << 20))
                + gzip.compress(b"]}"))
    proc = _run(["convert", "--host", str(bomb), "-o", str(tmp_path / "t.et")], {"ETWEAVE_MAX_INPUT_BYTES": "1048576"})
    assert proc.returncode == 2 and "host.json.gz: decompresses to more than the 1048576 byte" in proc.stderr


def _address_space_4gib() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_bomb_under_an_address_space_limit(tmp_path: Path) -> None:
    """A 2 MB gzip of a 2 GiB JSON string: under a 4 GiB address-space limit the default limit (a share of the
    smaller of available memory and RLIMIT_AS) refuses it cleanly; it used to crash the JSON parser."""
    member = gzip.compress(b"a" * (16 << 20), 9)
    bomb = _raw(tmp_path, "host.json.gz", gzip.compress(b'{"nodes":[{"id":1,"name":"') + member * 128
                + gzip.compress(b'"}]}'))
    assert bomb.stat().st_size < 3 << 20
    env = {k: v for k, v in os.environ.items() if k != "ETWEAVE_MAX_INPUT_BYTES"}
    proc = subprocess.run([sys.executable, "-m", "etweave", "convert", "--host", str(bomb), "-o",
                           str(tmp_path / "t.et")], capture_output=True, text=True, timeout=300, env=env,
                          preexec_fn=_address_space_4gib)
    said = re.search(r"host.json.gz: decompresses to more than the (\d+) byte input limit", proc.stderr)
    assert proc.returncode == 2 and said is not None and int(said[1]) <= 1 << 30, proc.stderr
    probe = subprocess.run([sys.executable, "-c", "from etweave.read.source import input_limit, memory_budget;"
                            "print(input_limit(), memory_budget())"], capture_output=True, text=True, env=env)
    limit, budget = map(int, probe.stdout.split())
    assert limit == max(64 << 20, budget // 4)
    assert limit >= 1 << 30 or budget < 6 << 30, "a 1 GB trace must fit a machine with 24 GB"


def test_window_from_a_negative_time(traces: Path, tmp_path: Path) -> None:
    """`--window -100:200` was taken by argparse for an option."""
    kineto = str(traces / PAIR / "kineto.json.gz")
    glued = _run(["convert", "--device", kineto, "--window=-100:", "-o", str(tmp_path / "a.et"), "--quiet"])
    spaced = _run(["convert", "--device", kineto, "--window", "-100:", "-o", str(tmp_path / "b.et"), "--quiet"])
    assert glued.returncode == spaced.returncode == 0, spaced.stderr
    assert (tmp_path / "a.et").read_bytes() == (tmp_path / "b.et").read_bytes()
    empty = _run(["convert", "--device", kineto, "--window", "-100:200", "-o", str(tmp_path / "c.et")])
    assert empty.returncode == 2 and "--window: selects no cpu op" in empty.stderr


# ---- class 7: a host ET and a Kineto trace of different runs or ranks: exit 3 naming both, unless allowed ----

MISMATCHED = [("gpu/linear/host.json.gz", "gpu/resnet/kineto.json.gz", "of process 24248"),
              ("cpu-gloo/dist_ddp_w2/rank0/host.json.gz", "cpu-gloo/dist_ddp_w2/rank1/kineto.json.gz",
               "Record function ids of"),
              ("gpu/dlrm-8rank/rank0/host.json.gz", "gpu/dlrm-8rank/rank1/kineto.json.gz", "of process 59811")]


@pytest.mark.parametrize("pair", MISMATCHED, ids=[p[0].split("/")[1] for p in MISMATCHED])
def test_mismatched_inputs_exit_3(traces: Path, tmp_path: Path, pair: tuple[str, str, str]) -> None:
    host, kineto, evidence = traces / pair[0], traces / pair[1], pair[2]
    out, report = tmp_path / "t.et", tmp_path / "r.json"
    proc = _run(["convert", "--host", str(host), "--device", str(kineto), "-o", str(out), "--report", str(report)])
    assert proc.returncode == 3 and str(host) in proc.stderr and str(kineto) in proc.stderr, proc.stderr
    assert "not of the same run and rank" in proc.stderr and evidence in proc.stderr
    assert list(tmp_path.iterdir()) == []
    allowed = _run(["convert", "--host", str(host), "--device", str(kineto), "-o", str(out), "--report", str(report),
                    "--allow-mismatch", "--quiet"])
    assert allowed.returncode == 0, allowed.stderr
    rep = orjson.loads(report.read_bytes())
    assert rep["warnings"]["inputs_mismatched"] == 1 and any(evidence in e for e in rep["link"]["mismatch"])
    assert "note" not in rep["link"]


def test_no_false_alarm_on_any_shared_pair(traces: Path) -> None:
    """Every pair of the shared traces is of one run and rank: gpu/ without Record function ids, dlrm's host ET
    from another step, the cpu-gloo runs that etweave.collect's way of recording wrote."""
    from conftest import pair_dirs

    from etweave.link import link_host, mismatch_evidence
    pairs = pair_dirs(traces)
    assert len(pairs) >= 17
    for d in pairs:
        host, kineto = read_host_et(d / "host.json.gz"), read_kineto(d / "kineto.json.gz")
        assert mismatch_evidence(host, kineto, link_host(host, kineto)) == [], d


def test_mismatch_without_process_ids_told_by_the_linked_share(traces: Path, tmp_path: Path) -> None:
    host = _host(traces, "gpu/linear")
    del host["pid"]
    proc = _run(["convert", "--host", str(_json(tmp_path, "linear.json", host)), "--device",
                 str(traces / "gpu/resnet/kineto.json.gz"), "-o", str(tmp_path / "t.et")])
    assert proc.returncode == 3 and "host ops link to a Kineto cpu op" in proc.stderr, proc.stderr
    assert "linear.json" in proc.stderr and "resnet/kineto.json.gz" in proc.stderr


def test_convert_run_rank_with_mismatched_files(traces: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    for r in (0, 1):
        (run / f"rank{r}").mkdir(parents=True)
        (run / f"rank{r}" / "host.json.gz").write_bytes((traces / f"cpu-gloo/dist_ddp_w2/rank{r}/host.json.gz")
                                                        .read_bytes())
        (run / f"rank{r}" / "kineto.json.gz").write_bytes((traces / f"cpu-gloo/dist_ddp_w2/rank{1 - r}/kineto.json.gz")
                                                          .read_bytes())
    proc = _run(["convert-run", str(run), "-o", str(tmp_path / "out"), "--jobs", "1"])
    assert proc.returncode == 3 and "not of the same run and rank" in proc.stderr and "rank0" in proc.stderr
    assert not (tmp_path / "out").exists()


# ---- class 8: Dask: paths resolved on the client, no worker -> a bounded wait, a report independent of spelling ----

def test_relative_run_dir_on_dask_and_report_independent_of_spelling(traces: Path, tmp_path: Path) -> None:
    from dask.distributed import LocalCluster

    run = tmp_path / "runs" / "ddp"
    run.parent.mkdir()
    os.symlink(traces / "cpu-gloo/dist_ddp_w2", run)
    local = _run(["convert-run", str(run) + "/", "-o", str(tmp_path / "a"), "--jobs", "1", "--quiet"])
    assert local.returncode == 0, local.stderr
    # the workers' working folder is this process's (the repository), not tmp_path: a relative path only works
    # when resolved on the client
    with LocalCluster(n_workers=1, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
        proc = subprocess.run([sys.executable, "-m", "etweave", "convert-run", "runs/./ddp", "-o", "b", "--scheduler",
                               cluster.scheduler_address, "--quiet"], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _snapshot(tmp_path / "a") == _snapshot(tmp_path / "b")
    assert orjson.loads((tmp_path / "a" / "report.json").read_bytes())["inputs"]["0"]["host"] == "rank0/host.json.gz"


def test_dask_cluster_without_workers_gives_up(traces: Path, tmp_path: Path) -> None:
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=True, dashboard_address=None) as cluster:
        proc = _run(["convert-run", str(traces / "cpu-gloo/dist_ddp_w2"), "-o", str(tmp_path / "out"), "--scheduler",
                     cluster.scheduler_address], {"ETWEAVE_DASK_WAIT": "2"})
    assert proc.returncode == 2 and "no worker for 2 s (2 of 2 ranks not converted)" in proc.stderr, proc.stderr
    assert cluster.scheduler_address.split("://")[1] in proc.stderr
    assert not (tmp_path / "out").exists()


# ---- the structured mutation fuzzer (tests/fuzz.py): every outcome an accepted answer ----

def test_mutation_fuzzer() -> None:
    """A few hundred cases in CI; ETWEAVE_FUZZ=long runs 10,000 (ETWEAVE_FUZZ=<n>: n) and prints the table. Under
    a 4 GiB address-space limit: no exit 1, no hang (60 s, far above 5x the unmutated inputs' time), no memory
    exhaustion, no message that is not one line naming the file, no file left behind."""
    profile = os.environ.get("ETWEAVE_FUZZ", "ci")
    cases = 10_000 if profile == "long" else int(profile) if profile.isdecimal() else 300
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "tests.fuzz", "--cases", str(cases), "--as-limit-gib", "4",
                           "--hang-seconds", "60"], capture_output=True, text=True, cwd=repo,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    print(proc.stdout)  # the outcome table (pytest -s shows it)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = orjson.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["failures"] == [], summary["failures"][:10]
    counts = summary["counts"]
    assert sum(counts.values()) == cases
    # every class ran, and the fuzzer reaches both sides of the contract
    classes = {key.split("/")[0] for key in counts}
    assert len(classes) == 12
    assert sum(v for k, v in counts.items() if k.endswith("/ok")) > 0
    assert sum(v for k, v in counts.items() if k.endswith("/bad_input")) > 0


# ---- property: any host field past int64 is bad input naming that field ----

_HOST_INT_FIELDS = ["ctrl_deps", "tid", "rf_id", "seq_id", "fw_parent", "fw_tid", "scope"]


@given(st.sampled_from(_HOST_INT_FIELDS), st.integers(1 << 63, (1 << 64) - 1), st.integers(0, 2**31))
def test_host_widths_property(traces: Path, tmp_path: Path, name: str, value: int, seed: int) -> None:
    doc = _host(traces, GLOO)
    node = random.Random(seed).choice(doc["nodes"][2:])
    if name == "ctrl_deps":
        node["ctrl_deps"] = value
    else:
        next(a for a in node["attrs"] if a["name"] == name)["value"] = value
    with pytest.raises(BadInput, match=rf"'{name}' {value} out of range") as info:
        read_host_et(_json(tmp_path, "h.json", doc))
    assert info.value.where.endswith("h.json")


@given(st.sampled_from(["ts", "dur", "tid", "pid"]), st.sampled_from([1e300, -1e300, float(1 << 63), 1 << 63]),
       st.integers(0, 2**31))
def test_kineto_widths_property(traces: Path, tmp_path: Path, name: str, value: float, seed: int) -> None:
    doc = _kineto(traces, GLOO)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    random.Random(seed).choice(events)[name] = value
    if name in ("tid", "pid") and isinstance(value, float):
        with pytest.raises(BadInput, match="not a Kineto trace"):  # a float where an int or a string belongs
            read_kineto(_json(tmp_path, "k.json", doc))
        return
    if name == "dur" and value < 0:  # negative durations are tolerated (counted, set to 0)
        read_kineto(_json(tmp_path, "k.json", doc))
        return
    with pytest.raises(BadInput, match=rf"traceEvents\[\d+\]\.{name} .* out of range"):
        read_kineto(_json(tmp_path, "k.json", doc))


def test_simulate_outputs_checked_before_the_replay(traces: Path, tmp_path: Path) -> None:
    et = tmp_path / "t.et"
    assert _run(["convert", *_pair_args(traces), "-o", str(et), "--quiet"]).returncode == 0
    before = et.read_bytes()
    onto_input = _run(["simulate", str(et), "--timeline", str(et)])
    assert onto_input.returncode == 2 and "--timeline is also an input" in onto_input.stderr
    missing = _run(["simulate", str(et), "--timeline", str(tmp_path / "nope" / "t.json")])
    assert missing.returncode == 2 and "the folder of --timeline does not exist" in missing.stderr
    assert missing.stdout == "" and et.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["t.et"]
