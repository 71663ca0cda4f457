"""read/source.py: a file's bytes, gunzipped by content, under the input limit."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from etweave.errors import BadInput
from etweave.read import source
from etweave.read.source import read_bytes, read_plain, reading_ahead


def test_plain_and_gzip_by_content_not_name(tmp_path: Path) -> None:
    zipped = gzip.compress(b"zipped")  # (once: its header holds the time, which a second call may not share)
    (tmp_path / "a.gz").write_bytes(b"plain")
    (tmp_path / "b.json").write_bytes(zipped)
    assert bytes(read_bytes(tmp_path / "a.gz")) == b"plain"
    assert bytes(read_bytes(tmp_path / "b.json")) == b"zipped"
    assert read_plain(tmp_path / "b.json") == zipped


def test_every_gzip_member_is_read(tmp_path: Path) -> None:
    (tmp_path / "m.gz").write_bytes(gzip.compress(b"one ") + gzip.compress(b"two"))
    assert bytes(read_bytes(tmp_path / "m.gz")) == b"one two"


def test_truncated_and_corrupt_gzip(tmp_path: Path) -> None:
    data = gzip.compress(b"x" * 10000)
    (tmp_path / "t.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput, match="truncated gzip stream"):
        read_bytes(tmp_path / "t.gz")
    (tmp_path / "c.gz").write_bytes(data[:10] + b"\xff" * (len(data) - 10))
    with pytest.raises(BadInput, match="corrupt gzip data"):
        read_bytes(tmp_path / "c.gz")


def test_limits(tmp_path: Path) -> None:
    (tmp_path / "bomb.gz").write_bytes(gzip.compress(b"\0" * 100_000))
    with pytest.raises(BadInput, match="decompresses to more than the 1000 byte input limit"):
        read_bytes(tmp_path / "bomb.gz", limit=1000)
    (tmp_path / "big").write_bytes(b"x" * 2000)
    with pytest.raises(BadInput, match="larger than the 1000 byte input limit"):
        read_plain(tmp_path / "big", limit=1000)


def test_a_folder_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="is a folder"):
        read_bytes(tmp_path)


def test_read_ahead_gives_the_same_bytes_and_errors(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.json.gz", tmp_path / "bad.json.gz"
    good.write_bytes(gzip.compress(b"zipped" * 1000))
    data = gzip.compress(b"x" * 10000)
    bad.write_bytes(data[: len(data) // 2])
    with reading_ahead([good, bad, tmp_path / "missing.json", tmp_path]):
        assert set(source._ahead) == {str(good), str(bad)}  # what is not a regular file is left to read_bytes
        assert bytes(read_bytes(good)) == b"zipped" * 1000
        with pytest.raises(BadInput, match="truncated gzip stream"):
            read_bytes(bad)
        assert source._ahead == {}  # each taken once
        assert bytes(read_bytes(good)) == b"zipped" * 1000  # then read as usual
        with pytest.raises(BadInput, match="is a folder"):
            read_bytes(tmp_path)


def test_what_was_read_ahead_and_not_taken_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"old")
    with reading_ahead([path]):
        assert bytes(read_bytes(path, limit=1 << 20)) == b"old"  # a caller's own limit reads now
        assert str(path) in source._ahead
    assert source._ahead == {}
    path.write_bytes(b"new")
    assert bytes(read_bytes(path)) == b"new"
