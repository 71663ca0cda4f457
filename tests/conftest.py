"""Shared fixtures. Real traces live in ../shared/traces beside the repository (ETWEAVE_TRACES overrides);
tests that need them fail, not skip, when they are missing."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import orjson
import pytest

from etweave.convert import Result, run_pipeline
from etweave.read.host_et import read_host_et
from etweave.read.kineto import read_kineto

REPO = Path(__file__).resolve().parents[1]


def traces_root() -> Path:
    return Path(os.environ.get("ETWEAVE_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def traces() -> Path:
    root = traces_root()
    if not (root / "gpu").is_dir():
        pytest.fail(f"the shared traces are missing: {root} (set ETWEAVE_TRACES)")
    return root


def pair_dirs(root: Path) -> list[Path]:
    """Every host+Kineto pair folder under gpu/ and cpu-gloo/."""
    return sorted(p.parent for p in [*root.glob("gpu/**/host.json.gz"), *root.glob("cpu-gloo/**/host.json.gz")])


PAIRS = [str(p.relative_to(traces_root())) for p in pair_dirs(traces_root())] if (traces_root() / "gpu").is_dir() \
    else ["missing"]

_cache: dict[str, Result] = {}


def convert_pair(root: Path, rel: str) -> Result:
    """Convert a pair once per session (the result is read-only in tests)."""
    if rel not in _cache:
        d = root / rel
        _cache[rel] = run_pipeline(read_host_et(d / "host.json.gz"), read_kineto(d / "kineto.json.gz"))
    return _cache[rel]


def load_gz(path: Path) -> dict:
    return orjson.loads(gzip.decompress(path.read_bytes()))


def write_gz(path: Path, doc: object) -> Path:
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    return path
