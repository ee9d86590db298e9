"""docs/results.md's evidence tables equal what benchmarks/campaign.py generates from the committed records
(benchmarks/results/), so no number in them is typed by hand; an edited or missing table is detected."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from campaign_plan import RESULTS_ROOT, load_tables  # noqa: E402
from campaign_tables import check_tables, write_tables  # noqa: E402

DOC = ROOT / "docs" / "results.md"


def test_the_committed_tables_equal_their_records() -> None:
    stale = check_tables(DOC, load_tables(), RESULTS_ROOT)
    assert stale == [], f"run `python benchmarks/campaign.py tables --write docs/results.md` ({stale} differ)"


def test_a_hand_edited_or_missing_table_is_detected_and_rewritten(tmp_path: Path) -> None:
    tables = load_tables()
    first = next(iter(tables))
    doc = tmp_path / "results.md"
    text = DOC.read_text()
    start = text.index(f"<!-- campaign:{first} -->\n") + len(f"<!-- campaign:{first} -->\n")
    doc.write_text(text[:start] + "| typed | 99.99 |\n" + text[start:])
    assert check_tables(doc, tables, RESULTS_ROOT) == [first]
    write_tables(doc, tables, RESULTS_ROOT)
    assert check_tables(doc, tables, RESULTS_ROOT) == [] and doc.read_text() == text
    doc.write_text(text.replace(f"<!-- /campaign:{first} -->", ""))
    assert first in check_tables(doc, tables, RESULTS_ROOT)
