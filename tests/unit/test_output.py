"""etweave.output.write_together: every output of a command written, or none; never over an input."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from etweave.errors import BadInput
from etweave.output import FileBytes, JsonFile, check_outputs, write_together


def leftovers(folder: Path) -> list[str]:
    """Temporary files a write left behind (.<name>.tmp-<pid> / .old-<pid>)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@dataclass
class Recorded:
    """A Writer that notes when its bytes are asked for, and can fail while producing them."""

    path: Path
    calls: list[str] = field(default_factory=list)
    fail: bool = False

    def content(self) -> Iterator[bytes]:
        self.calls.append(self.path.name)
        yield b"first chunk,"
        if self.fail:
            raise RuntimeError("producer failed half-way")
        yield b"second chunk"


def test_all_outputs_written_with_their_bytes(tmp_path: Path) -> None:
    written = write_together([FileBytes(tmp_path / "a.bin", [b"ab", b"cd"]),
                              JsonFile(tmp_path / "r.json", {"z": 1, "a": [1, 2]})])
    assert written == [tmp_path / "a.bin", tmp_path / "r.json"]
    assert (tmp_path / "a.bin").read_bytes() == b"abcd"
    assert (tmp_path / "r.json").read_bytes() == b'{\n  "a": [\n    1,\n    2\n  ],\n  "z": 1\n}\n'  # keys sorted
    assert leftovers(tmp_path) == []


def test_contents_produced_in_order_when_staged(tmp_path: Path) -> None:
    calls: list[str] = []
    first, second = Recorded(tmp_path / "1", calls), Recorded(tmp_path / "2", calls)
    write_together([first, second])
    assert calls == ["1", "2"]
    assert (tmp_path / "2").read_bytes() == b"first chunk,second chunk"


def test_failing_producer_leaves_nothing_new_or_changed(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_bytes(b"previous")
    calls: list[str] = []
    outputs = [FileBytes(tmp_path / "old.txt", b"new"), FileBytes(tmp_path / "fresh.txt", b"new"),
               Recorded(tmp_path / "broken.txt", calls, fail=True), Recorded(tmp_path / "never.txt", calls)]
    with pytest.raises(RuntimeError, match="half-way"):
        write_together(outputs)
    assert calls == ["broken.txt"]  # nothing after the failure is produced
    assert (tmp_path / "old.txt").read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


def test_failed_rename_puts_previous_files_back(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"previous a")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inside").write_bytes(b"x")  # a non-empty folder: renaming a file onto it fails
    with pytest.raises(BadInput, match="cannot write"):
        write_together([FileBytes(tmp_path / "a.txt", b"new a"), FileBytes(tmp_path / "folder", b"new")])
    assert (tmp_path / "a.txt").read_bytes() == b"previous a"
    assert (tmp_path / "folder" / "inside").read_bytes() == b"x"
    assert leftovers(tmp_path) == []


def test_an_input_is_never_overwritten(tmp_path: Path) -> None:
    source = tmp_path / "trace.et"
    source.write_bytes(b"the input")
    alias = tmp_path / "alias.et"
    alias.symlink_to(source)
    with pytest.raises(BadInput, match="is also an input"):
        write_together([FileBytes(tmp_path / "other.json", b"{}"), FileBytes(alias, b"overwritten")],
                       inputs=[None, source])
    assert source.read_bytes() == b"the input"
    assert not (tmp_path / "other.json").exists()  # refused before anything is written


def test_check_outputs_refuses_inputs_and_duplicates(tmp_path: Path) -> None:
    source = tmp_path / "in.et"
    source.write_bytes(b"x")
    with pytest.raises(BadInput, match="--csv is also an input"):
        check_outputs([("--csv", source)], [source])
    with pytest.raises(BadInput, match="given as both --plot and --breakdown"):
        check_outputs([("--plot", tmp_path / "p.png"), ("--breakdown", tmp_path / "p.png")], [])
    check_outputs([("--plot", tmp_path / "p.png")], [source])  # a fine output: no error, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.et"]


def test_json_file_is_indented_and_sorted(tmp_path: Path) -> None:
    obj = {"b": {"y": 2, "x": 1}, "a": None}
    write_together([JsonFile(tmp_path / "o.json", obj)])
    data = (tmp_path / "o.json").read_bytes()
    assert orjson.loads(data) == obj
    assert data.index(b'"a"') < data.index(b'"b"') and data.index(b'"x"') < data.index(b'"y"')
