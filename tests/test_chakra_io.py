"""`.et` reading and writing beyond the plain file: gzip both ways, `jsonize --format chakra` against protobuf's
JSON mapping, `jsonize -o`."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format

from etweave.chakra import et_def_pb2 as pb
from etweave.chakra.io import decode_varint, iter_et, parse, read_et, serialize, varint_bytes
from etweave.cli import main

PAIR = "gpu/simple-add"


@pytest.fixture(scope="module")
def plain_and_gz(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("gz")
    src = traces / PAIR
    args = ["convert", "--host", str(src / "host.json.gz"), "--device", str(src / "kineto.json.gz"), "--quiet"]
    assert main([*args, "-o", str(out / "t.0.et")]) == 0
    assert main([*args, "-o", str(out / "t.0.et.gz")]) == 0
    return out / "t.0.et", out / "t.0.et.gz"


def test_gz_written_only_for_a_gz_name_and_round_trips(plain_and_gz: tuple[Path, Path], tmp_path: Path) -> None:
    plain, gz = plain_and_gz
    assert plain.read_bytes()[:2] != b"\x1f\x8b"
    assert gz.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(gz.read_bytes()) == plain.read_bytes()
    m1, n1 = read_et(plain)
    m2, n2 = read_et(gz)
    assert m1 == m2 and n1 == n2 and len(n1) > 50
    # the same input gives the same compressed bytes (no name or time in the gzip header)
    again = tmp_path / "again.et.gz"
    from etweave.chakra.io import write_et
    write_et(again, m2, n2)
    assert again.read_bytes() == gz.read_bytes()


def test_gz_is_read_by_check_simulate_and_jsonize(plain_and_gz: tuple[Path, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    plain, gz = plain_and_gz
    assert main(["check", str(gz)]) == 0
    captured = capsys.readouterr()
    assert "gzip" in captured.err and "ASTRA-sim" in captured.err and "clean" in captured.out
    assert main(["check", str(plain)]) == 0
    assert "gzip" not in capsys.readouterr().err
    assert main(["simulate", str(gz), "--json"]) == 0
    sim_gz = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(plain), "--json"]) == 0
    sim_plain = json.loads(capsys.readouterr().out)
    sim_gz["per_rank"][0].pop("file"), sim_plain["per_rank"][0].pop("file")
    assert sim_gz == sim_plain
    assert main(["jsonize", str(gz)]) == 0
    from_gz = capsys.readouterr().out
    assert main(["jsonize", str(plain)]) == 0
    assert capsys.readouterr().out == from_gz


def _objects(text: str) -> list[dict]:
    """Concatenated JSON objects, as chakra_jsonizer writes them."""
    decoder, pos, out = json.JSONDecoder(), 0, []
    while pos < len(text):
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)
    return out


def test_chakra_format_is_protobufs_json_mapping_per_message(plain_and_gz: tuple[Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    plain, _ = plain_and_gz
    metadata, nodes = read_et(plain)
    out = tmp_path / "chakra.json"
    assert main(["jsonize", str(plain), "--format", "chakra", "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    objects = _objects(out.read_text())
    assert len(objects) == 1 + len(nodes)
    assert objects[0] == json_format.MessageToDict(metadata)
    for obj, node in zip(objects[1:], nodes, strict=True):
        assert obj == json_format.MessageToDict(node)
        assert json_format.ParseDict(obj, pb.Node()) == node  # and it reads back to the same message
    # protobuf's JSON names, not the proto field names; defaults left out, as Chakra's jsonizer prints them
    timed = next(o for o in objects[1:] if "startTimeMicros" in o)
    assert "start_time_micros" not in timed and any("dataDeps" in o or "ctrlDeps" in o for o in objects)
    assert main(["jsonize", str(plain), "--format", "chakra"]) == 0
    assert capsys.readouterr().out == out.read_text()


def test_etweave_format_to_file_matches_stdout(plain_and_gz: tuple[Path, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    plain, _ = plain_and_gz
    out = tmp_path / "t.json"
    assert main(["jsonize", str(plain), "-o", str(out)]) == 0
    assert main(["jsonize", str(plain)]) == 0
    doc = json.loads(out.read_text())
    assert out.read_text() == capsys.readouterr().out
    _, nodes = read_et(plain)
    assert len(doc["nodes"]) == len(nodes) and doc["nodes"][0]["id"] == str(nodes[0].id)
    assert "data_deps" in doc["nodes"][0]  # every field, also at its default


def test_jsonize_of_a_truncated_file_writes_nothing(plain_and_gz: tuple[Path, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    plain, _ = plain_and_gz
    bad = tmp_path / "bad.et"
    bad.write_bytes(plain.read_bytes()[:-7])
    out = tmp_path / "out.json"
    for fmt in ("etweave", "chakra"):
        assert main(["jsonize", str(bad), "--format", fmt, "-o", str(out)]) == 2
        assert "truncated" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.et"]
    corrupt = tmp_path / "corrupt.et.gz"
    corrupt.write_bytes(gzip.compress(plain.read_bytes())[:-40])
    assert main(["jsonize", str(corrupt), "-o", str(out)]) == 2
    assert not out.exists()


def test_streamed_reader_matches_whole_buffer_parse(plain_and_gz: tuple[Path, Path]) -> None:
    plain, _ = plain_and_gz
    data = plain.read_bytes()
    metadata, nodes = iter_et(plain)
    assert (metadata, list(nodes)) == parse(data)
    assert serialize(*parse(data)) == data


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**31, 2**63 - 1])
def test_varint_round_trip(value: int) -> None:
    encoded = varint_bytes(value)
    assert decode_varint(encoded + b"\x00", 0) == (value, len(encoded))


def test_reading_and_jsonize_hold_a_chunk_not_the_file(tmp_path: Path) -> None:
    """Memory stays near one read chunk (1 MiB) whatever the file's size: nodes are read and written one by one."""
    import tracemalloc

    from etweave.chakra.io import write_et

    def nodes() -> Iterator[pb.Node]:
        for i in range(1, 8_001):
            node = pb.Node(id=i, name=f"aten::op_{i}" + "x" * 1200, type=pb.COMP_NODE,
                           data_deps=[i - 1] if i > 1 else [], start_time_micros=1_000_000 + i, duration_micros=3)
            node.attr.add(name="kind", string_val="host_op")
            yield node

    path = tmp_path / "big.et"
    write_et(path, pb.GlobalMetadata(version="0.0.4"), nodes())
    size = path.stat().st_size
    assert size > 8 << 20
    tracemalloc.start()
    try:
        _, it = iter_et(path)
        count = sum(1 for _ in it)
        read_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert main(["jsonize", str(path), "--format", "chakra", "-o", str(tmp_path / "big.json")]) == 0
        jsonize_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 8_000
    assert read_peak < size / 2 and jsonize_peak < size / 2, (read_peak, jsonize_peak, size)
