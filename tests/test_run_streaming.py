"""convert-run holds one rank's stream at a time: each converted rank is spilled to a spool folder in OUT_DIR as it
arrives, each final stream staged beside its target as soon as it is final, and all renamed into place together;
a run that fails after every rank was staged leaves OUT_DIR as it was, with no spool folder or staged file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from etweave import check
from etweave import run as whole_run
from etweave.chakra.io import parse, serialize
from etweave.check import Violation
from etweave.errors import CheckFailed
from etweave.run import cross_rank

RUN = "cpu-gloo/dist_ddp_w2"  # two small gloo ranks with collectives and send/recv


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("jobs", [1, 2])
def test_ranks_wait_on_disk_not_in_memory(traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          jobs: int) -> None:
    out = tmp_path / "out"
    seen: dict[str, Any] = {}
    real_assemble = whole_run.assemble_run
    real_put = cross_rank.RankStreams.put

    def assemble(outputs: list[whole_run.ConvertedRank], *args: Any) -> whole_run.RunResult:
        seen["streams"] = [o.et for o in outputs]  # what the parent holds of every rank before the cross-rank work
        return real_assemble(outputs, *args)

    def put(self: cross_rank.RankStreams, rank: int, *args: Any) -> None:
        real_put(self, rank, *args)
        seen.setdefault("staged", []).append(sorted(p.name for p in out.iterdir()))

    monkeypatch.setattr(whole_run, "assemble_run", assemble)
    monkeypatch.setattr(cross_rank.RankStreams, "put", put)
    result = whole_run.convert_run(traces / RUN, out, jobs=jobs)

    spilled = seen["streams"]
    assert len(spilled) == 2 and all(isinstance(s, Path) for s in spilled)
    assert len({s.parent for s in spilled}) == 1 and spilled[0].parent.name.startswith(whole_run.SPOOL_PREFIX)
    assert {s.parent.parent for s in spilled} == {out}
    # rank 0 final: staged beside its target before rank 1 is worked on; nothing in place until the end
    first, second = seen["staged"]
    assert [n for n in first if n.startswith(".trace.")] == [f".trace.0.et.tmp-{os.getpid()}"]
    assert not [n for n in second if not n.startswith(".")]
    assert sorted(p.name for p in out.iterdir()) == ["comm_group.json", "report.json", "trace.0.et", "trace.1.et"]
    # the result reads its ranks from the files written
    assert result.ranks.stream(1) == (out / "trace.1.et").read_bytes()
    assert len(result.ranks[0][1]) == result.ranks.node_counts[0]


@pytest.mark.parametrize("jobs", [1, 2])
def test_workers_write_the_streams(traces: Path, tmp_path: Path, jobs: int) -> None:
    """With a spool folder, the converter (a pool worker, or this process) writes each stream there itself: what
    arrives is its path, never its bytes, and the file holds the stream converted in memory."""
    found = whole_run.discover((traces / RUN).resolve())
    arrived: list[bytes | Path] = []

    def keep(out: whole_run.ConvertedRank) -> whole_run.ConvertedRank:
        arrived.append(out.et)
        return out

    spooled = whole_run.convert_ranks(found.ranks, jobs=jobs, keep=keep, spool=tmp_path)
    assert sorted(arrived, key=str) == [tmp_path / "task0.et", tmp_path / "task1.et"]
    in_memory = whole_run.convert_ranks(found.ranks, jobs=1)
    for out, mem in zip(spooled, in_memory, strict=True):
        assert isinstance(out.et, Path) and isinstance(mem.et, bytes)
        assert out.et.read_bytes() == mem.et and out.summary == mem.summary


def test_same_bytes_as_in_memory(traces: Path, tmp_path: Path) -> None:
    """The streams staged on disk are the bytes the cross-rank work gives in memory (assemble_run without an
    output folder)."""
    result = whole_run.convert_run(traces / RUN, tmp_path / "out", jobs=1)
    found = whole_run.discover((traces / RUN).resolve())
    in_memory = cross_rank.assemble_run(whole_run.convert_ranks(found.ranks, jobs=1), discovery=found)
    assert sorted(in_memory.ranks) == sorted(result.ranks) == [0, 1]
    # without the workers' summaries (the parent reads each rank whole): the same streams
    unsummarized = [msgspec.structs.replace(out, summary=None) for out in whole_run.convert_ranks(found.ranks, jobs=1)]
    assert all(out.summary is not None for out in whole_run.convert_ranks(found.ranks[:1], jobs=1))
    parent_read = cross_rank.assemble_run(unsummarized, discovery=found)
    for rank in in_memory.ranks:
        stream = result.ranks.stream(rank)
        assert in_memory.ranks.stream(rank) == parent_read.ranks.stream(rank) == stream
        # spliced, not re-serialized: still exactly protobuf's bytes for the nodes it holds
        assert serialize(*parse(stream)) == stream


def test_failure_after_staging_leaves_the_folder_as_it_was(traces: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    whole_run.convert_run(traces / RUN, out, jobs=1)
    (out / "trace.1.et").write_bytes(b"an older rank 1")
    before = snapshot(out)
    real_check_run = check.check_run

    def failing(*args: Any) -> list[Violation]:
        return [*real_check_run(*args), Violation("dangling-data-dep", "rank 1", "injected")]

    monkeypatch.setattr(cross_rank, "check_run", failing)  # runs after every rank's final stream was staged
    with pytest.raises(CheckFailed, match="injected"):
        whole_run.convert_run(traces / RUN, out, jobs=2)
    assert snapshot(out) == before  # no spool folder, no staged file, nothing replaced
