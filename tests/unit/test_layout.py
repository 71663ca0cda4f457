"""The README's "Layout" table against the code, as sqlite-utils tests its docs: every module it names exists, the
`STAGES` it names are convert.STAGES in order, and every stage's unit tests exist and import the stage's module."""

from __future__ import annotations

import re
from pathlib import Path

from etweave.convert import STAGES
from etweave.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def _table() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout"):]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_every_module_of_the_table_exists() -> None:
    rows = _table()
    assert len(rows) >= 10
    for stage, _, modules, _, _ in rows:
        for module in _names(modules):
            assert (ROOT / module).exists(), f"{stage}: {module} is not in the repository"


def test_the_table_lists_the_stages_in_the_order_they_run() -> None:
    listed = [name for row in _table() for name in _names(row[1])]
    assert listed == [s.name for s in STAGES]


def test_every_stage_has_unit_tests_that_import_it() -> None:
    for stage, _, modules, _, tests in _table():
        dotted = [m.removesuffix(".py").removesuffix("/").replace("/", ".") for m in _names(modules)]
        assert _names(tests), f"{stage}: no unit tests named"
        for test in _names(tests):
            source = (ROOT / "tests" / "unit" / test).read_text()
            assert any(re.search(rf"\b{re.escape(d)}\b", source) for d in dotted), \
                f"{stage}: tests/unit/{test} imports none of {dotted}"


def test_one_version() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+: the one line is enough
    found = re.search(r'^version = "([^"]+)"$', pyproject, re.M)
    assert found is not None and found[1] == __version__
