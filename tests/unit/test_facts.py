"""docs/FACTS.md is the one home of the facts the code relies on: every section the code cites is there; and the
unit tests stand alone (nothing under tests/unit reads the shared traces)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SECTION = re.compile(r"§([A-Z]\d*)")
_HEADING = re.compile(r"^#{2,3} §([A-Z]\d*) ", re.M)


def facts_sections() -> set[str]:
    return set(_HEADING.findall((REPO / "docs" / "FACTS.md").read_text()))


def cited_sections(paths: list[Path]) -> dict[str, set[str]]:
    """Per file, the sections named on its lines that cite FACTS.md."""
    cited: dict[str, set[str]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if "FACTS.md" in line:
                cited.setdefault(str(path.relative_to(REPO)), set()).update(_SECTION.findall(line))
    return cited


def test_every_cited_section_exists() -> None:
    have = facts_sections()
    assert {"H1", "E2", "A1", "A7"} <= have
    code = [p for p in sorted((REPO / "etweave").rglob("*")) if p.suffix in (".py", ".pyi", ".proto")]
    docs = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "FACTS.md")]
    assert cited_sections(code), "the code cites no FACTS.md section"
    cited = cited_sections(code + docs)
    missing = {f: sorted(s - have) for f, s in cited.items() if s - have}
    assert not missing, f"sections cited but not in docs/FACTS.md: {missing}"


def test_every_fact_names_its_source() -> None:
    text = (REPO / "docs" / "FACTS.md").read_text()
    for block in re.split(r"^### ", text, flags=re.M)[1:]:
        assert "(FORMATS.md §" in block, f"no FORMATS.md section given for: {block.splitlines()[0]}"


def test_the_code_cites_facts_not_formats() -> None:
    # FORMATS.md lives outside the repository and changes; the code cites docs/FACTS.md, which says where from
    code = [p for p in sorted((REPO / "etweave").rglob("*")) if p.suffix in (".py", ".pyi", ".proto")]
    assert len(code) > 40
    for path in code:
        assert "FORMATS.md" not in path.read_text(), path.relative_to(REPO)


def test_unit_tests_stand_alone() -> None:
    banned = ("../shared", "shared/traces", "ETWEAVE_TRACES", "traces_root", "pair_dirs", "tests.conftest")
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        if path == Path(__file__):
            continue  # this test names what it looks for
        text = path.read_text()
        found = [b for b in banned if b in text]
        found += re.findall(r"def test_\w+\([^)]*\btraces\b", text)  # the `traces` fixture of tests/conftest.py
        assert not found, f"{path.name} uses the shared traces: {found}"
