"""The wheel as a user gets it: built from a copy of the repository, installed with the `plot` extra into a fresh
virtual environment at the protobuf floor pyproject.toml declares (no torch), then the README's first Python
code block runs there and writes what it says, the per-step breakdown PNG of the bundled example included."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import etweave
from etweave.chakra.io import read_et
from etweave.cli import main

REPO = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(".venv", ".git", "__pycache__", "build", "dist", "*.egg-info", ".pytest_cache",
                                 ".ruff_cache", ".hypothesis", ".whl", "etweave-example")


def readme_first_python_block() -> str:
    block = re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block is not None
    return block.group(1)


def protobuf_floor() -> str:
    m = re.search(r'"protobuf>=([0-9.]+)', (REPO / "pyproject.toml").read_text())
    assert m is not None, "pyproject.toml must state a protobuf floor"
    return m.group(1)


def run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    # the fresh venv must see only what was installed into it: a PYTHONPATH naming a checkout would make pip find
    # that checkout's etweave.egg-info "already satisfied" and install no `etweave` script
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the fresh venv's python)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    shutil.copytree(REPO, src, ignore=IGNORED)
    build = run([sys.executable, "-W", "always", "-c",
                 f"from setuptools import build_meta; print(build_meta.build_wheel({str(dist)!r}))"], src)
    # e.g. project.license as a TOML table: a warning on every install
    assert "SetuptoolsDeprecationWarning" not in build.stderr + build.stdout, build.stderr[-2000:]
    wheel = dist / build.stdout.strip().splitlines()[-1]
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp)
    python = venv / "bin" / "python"
    floor = protobuf_floor()
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[plot]",
         f"protobuf=={floor}.*"], tmp)
    return wheel, python


def test_wheel_contents(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {"etweave/py.typed", "etweave/chakra/et_def_pb2.py", "etweave/chakra/et_def_pb2.pyi",
            "etweave/examples/gloo_w2/rank0/host.json.gz", "etweave/examples/gloo_w2/rank1/kineto.json.gz"} <= names
    assert "License-Expression: MIT" in metadata
    assert f"protobuf<8,>={protobuf_floor()}" in metadata.replace(" ", "")


def test_no_protobuf_internals_in_etweaves_own_code() -> None:
    # et_def_pb2.py is protoc's generated code: its `internal.builder` import is protobuf's own contract
    own = [p for p in (REPO / "etweave").rglob("*.py") if p.name != "et_def_pb2.py"]
    assert own and not [p for p in own if "google.protobuf.internal" in p.read_text()]


def test_readme_block_runs_in_a_fresh_venv_at_the_protobuf_floor(installed: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    _, python = installed
    probe = run([str(python), "-c", "import importlib.util, google.protobuf as p; "
                 "print(p.__version__, importlib.util.find_spec('torch') is None)"], tmp_path)
    version, no_torch = probe.stdout.split()
    assert version.startswith(protobuf_floor() + ".") and no_torch == "True"

    script = tmp_path / "readme_block.py"
    script.write_text(readme_first_python_block())
    assert len(script.read_text().splitlines()) <= 25
    out = run([str(python), str(script)], tmp_path).stdout
    assert "RunResult(2 rank(s)" in out and "Simulation(2 rank(s)" in out and "consistent" in out
    for name in ("nodes.csv", "timeline.json", "timeline.png", "breakdown.png", "out/trace.0.et", "out/trace.1.et"):
        assert (tmp_path / name).stat().st_size > 0, name
    for png in ("timeline.png", "breakdown.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the old protobuf writes the same .et bytes as this one, and reads and prints them the same
    here = tmp_path / "here"
    etweave.convert_run(etweave.example_run_dir(), here, jobs=1)
    for rank in (0, 1):
        assert (tmp_path / f"out/trace.{rank}.et").read_bytes() == (here / f"trace.{rank}.et").read_bytes()
    cli = python.parent / "etweave"
    for fmt in ("etweave", "chakra"):
        run([str(cli), "jsonize", "out/trace.0.et", "--format", fmt, "-o", f"{fmt}.json"], tmp_path)
        assert main(["jsonize", str(here / "trace.0.et"), "--format", fmt, "-o",
                     str(tmp_path / f"{fmt}.here.json")]) == 0
        assert (tmp_path / f"{fmt}.json").read_bytes() == (tmp_path / f"{fmt}.here.json").read_bytes(), fmt
    assert len(read_et(tmp_path / "out/trace.0.et")[1]) > 900
    example = run([str(cli), "example", "-o", "ex"], tmp_path).stdout
    assert "cross-rank check: consistent" in example and "linked by rf_id:" in example
