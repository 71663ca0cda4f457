"""The docs name the evidence sources the code has, with the properties the registry gives them (as sqlite-utils
tests its docs): the README's "Dependencies" table, and docs/OUTPUT.md's names."""

from __future__ import annotations

import re
from pathlib import Path

from etweave.deps import SOURCES
from etweave.deps.evidence import Evidence

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(\w+)` \| ([a-z ]+) \| (yes|no) \| ")


def _readme_table() -> dict[str, tuple[str, bool]]:
    """source name -> (edges, waits) from the table under "Evidence sources"."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Dependencies"):]
    table = section[section.index("| source | edges | waits | evidence |"):]
    rows: dict[str, tuple[str, bool]] = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        m = ROW.match(line)
        assert m, f"a row of the evidence table the test cannot read: {line[:80]}"
        rows[m[1]] = (m[2], m[3] == "yes")
    return rows


def test_readme_table_is_the_registry() -> None:
    rows = _readme_table()
    assert set(rows) == {e.value for e in Evidence}, "every source in the table is in the registry, and vice versa"
    for e in Evidence:
        assert rows[e.value] == (e.basis.value, e.waits), f"{e.value}: README says {rows[e.value]}"


def test_readme_table_is_in_the_order_applied() -> None:
    per_rank = [name for name in _readme_table() if name in {e.value for e in SOURCES}]
    assert per_rank == [e.value for e in SOURCES]


def test_every_member_but_the_run_wide_one_has_a_source() -> None:
    assert set(Evidence) - set(SOURCES) == {Evidence.RANK_START_OFFSET}



def test_output_doc_names_the_wait_finders_and_dep_evidence_names() -> None:
    text = (REPO / "docs" / "OUTPUT.md").read_text()
    m = re.search(r"wait finders included\s*\(([^)]*)\)", text)
    assert m, "docs/OUTPUT.md lists the sources of the waits stage under edges.per_source"
    listed = set(re.findall(r"`(\w+)`", m[1]))
    # each wait source has its own module, with the finder the waits stage runs
    found_by_waits = {e.value for e, source in SOURCES.items() if source.__module__ == f"etweave.deps.{e.value}"}
    assert listed == found_by_waits
    dep_evidence = next(line for line in text.splitlines() if "attr `dep_evidence`" in line)
    assert set(re.findall(r"`(\w+)`", dep_evidence)) - {"dep_evidence", "data_deps", "convert-run"} <= {
        e.value for e in Evidence}
