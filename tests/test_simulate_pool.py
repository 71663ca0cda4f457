"""The loading pool (`etweave.simulate.pool`): files read by this process and a worker give what one process
reading them in turn gives, and a bad file read by either is the error raised, the first in file order."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from etweave.convert import convert
from etweave.errors import BadInput
from etweave.simulate.astra import AstraRank, intern_strings, load_astra_rank
from etweave.simulate.pool import MIN_FILES, load_files


def test_bad_input_pickles_whole() -> None:
    """A worker's BadInput crosses to the parent as raised: its file and its problem, not only its message."""
    got = pickle.loads(pickle.dumps(BadInput("trace.3.et", "not a Chakra trace")))
    assert (type(got), got.where, got.problem, str(got)) == (BadInput, "trace.3.et", "not a Chakra trace",
                                                             "trace.3.et: not a Chakra trace")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, traces: Path) -> list[Path]:
    out = tmp_path_factory.mktemp("pool")
    first = out / "trace.0.et"
    convert(None, traces / "kineto-only/event-sync-multistream.json.gz", first, rank=0)
    files = [first]
    for r in range(1, MIN_FILES):
        files.append(out / f"trace.{r}.et")
        shutil.copyfile(first, files[-1])
    return files


def _load(files: list[Path], jobs: int) -> list[AstraRank]:
    return load_files(files, load_astra_rank, AstraRank, intern_strings, jobs=jobs)


def test_a_worker_loads_what_this_process_loads(folder: list[Path]) -> None:
    alone, shared = _load(folder, 1), _load(folder, 2)
    assert [rg.rank for rg in shared] == list(range(MIN_FILES))
    assert shared == alone


@pytest.mark.parametrize("bad", [[3, 6], [6, 9]])  # odd: a worker's file; even: this process's
def test_the_first_bad_file_in_file_order_is_raised(folder: list[Path], tmp_path: Path, bad: list[int]) -> None:
    files = []
    for i, f in enumerate(folder):
        files.append(tmp_path / f.name)
        if i in bad:
            files[-1].write_bytes(b"\x05not a trace")
        else:
            shutil.copyfile(f, files[-1])
    with pytest.raises(BadInput) as one_by_one:
        _load(files, 1)
    with pytest.raises(BadInput) as pooled:
        _load(files, 2)
    assert pooled.value.where == one_by_one.value.where == str(files[bad[0]])
    assert pooled.value.problem == one_by_one.value.problem
