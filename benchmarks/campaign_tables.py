"""docs/results.md's evidence tables, generated from the committed run records and nothing else.

Each table of ``benchmarks/results/tables.yaml`` is a region of docs/results.md between
``<!-- campaign:NAME -->`` and ``<!-- /campaign:NAME -->``: its title, the ``cfl report`` table of its records
(its ``columns``, else method, runs, seeds, ACC, FGT, AIA, FWT, upload, wall), how many of the planned runs it
holds, and the commits and machines that made them; then the runs that diverged (failure records, by run name and
short cause, never as rows: benchmarks/campaign_failures.py); a tuning table's region adds its grid and chosen
values (benchmarks/campaign_tuning.py). A table without records says so and names the command that makes them.
``tests/project/test_results_tables.py`` checks that the committed docs equal what this prints.
"""

from __future__ import annotations

import json
import re
from math import prod
from pathlib import Path
from typing import Any

import yaml
from campaign_failures import failures_text, load_failures
from campaign_plan import ROOT
from campaign_published import published_text
from campaign_tuning import method_grids, selection_note

from cfl.report.groups import load_runs
from cfl.report.table import TableOptions, report_table

#: a table's columns unless it names its own (``columns`` in tables.yaml: ``cfl report --columns`` keys)
COLUMNS = ("method", "runs", "seeds", "acc", "fgt", "aia", "fwt", "upload", "wall")


def _records(results_root: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((results_root / name).rglob("results.json"))]


def _planned(table: dict[str, Any]) -> str:
    return f"seeds {', '.join(map(str, table.get('seeds', [0])))} of {', '.join(table['sweeps'])}"


def _planned_count(table: dict[str, Any]) -> int | None:
    """How many runs the table plans: each sweep's grid at the table's seeds, its variants kept by ``only``
    (the product the sweep expands, counted from the files without resolving a config); None where a sweep file
    is not there (a test's table) or ``only`` filters a sweep without variants."""
    count = 0
    for sweep in table["sweeps"]:
        if not (ROOT / sweep).is_file():
            return None
        grid = dict((yaml.safe_load((ROOT / sweep).read_text()) or {}).get("grid") or {})
        grid["seed"] = table.get("seeds", [0])
        if table.get("only") is not None:
            if "variant" not in grid:
                return None
            grid["variant"] = [v for v in grid["variant"] if v.get("label") in table["only"]]
        count += prod(len(values) for values in grid.values())
    return count


def render_table(name: str, table: dict[str, Any], results_root: Path) -> str:
    """The region's body: title, table (or why there is none), provenance."""
    title = f"**{table.get('title', name)}** (campaign table `{name}`: {_planned(table)})"
    records, failures = _records(results_root, name), load_failures(results_root, name)
    failed = f"\n\n{failures_text(failures)}" if failures else ""
    if not records:
        return (f"{title}\n\nNo records yet. Made by `python benchmarks/campaign.py run --table {name} --minutes M "
                f"--jobs N` (add `--set device=cuda` on a GPU).{failed}")
    labels = [r["config"].get("label") for r in records]
    order = tuple(n for n in table.get("order", []) if n in labels) or None
    columns = tuple(table.get("columns") or COLUMNS)
    body = report_table(load_runs([results_root / name]), "md", TableOptions(columns=columns, order=order))
    machines = sorted({_machine(r["record"]["machine"]) for r in records})
    commits = sorted({r["record"]["commit"] for r in records})
    note = f"\n\n{selection_note(method_grids(name, table, records, failures))}" if table.get("tuning") else ""
    planned = _planned_count(table)
    count = (f"{len(records)} records" if planned is None or len(records) + len(failures) >= planned
             else f"{len(records)} records of {planned} planned runs (partial)")
    paper = (f"\n\n{published_text(table['published'], records, table.get('seeds', [0]), table.get('order', []))}"
             if table.get("published") else "")
    return (f"{title}\n\n{body.rstrip()}\n\n{count}; commits {', '.join(commits)}; "
            f"machines: {'; '.join(machines)}.{failed}{paper}{note}")


def _machine(m: dict[str, Any]) -> str:
    device = m.get("gpu") or f"{m.get('cpu')} ({m.get('cores')} cores)"
    return f"{device}, torch {m.get('torch')}"


def render_tables(tables: dict[str, dict[str, Any]], results_root: Path) -> str:
    return "\n\n".join(_region(n, render_table(n, t, results_root)) for n, t in tables.items())


def _region(name: str, body: str) -> str:
    return f"<!-- campaign:{name} -->\n{body}\n<!-- /campaign:{name} -->"


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- campaign:{re.escape(name)} -->\n(?:.*?\n)?<!-- /campaign:{re.escape(name)} -->", re.S)


def check_tables(doc: Path, tables: dict[str, dict[str, Any]], results_root: Path) -> list[str]:
    """The tables whose region in ``doc`` is missing or differs from their records."""
    text = doc.read_text()
    stale = []
    for name, table in tables.items():
        found = _pattern(name).search(text)
        if found is None or found.group(0) != _region(name, render_table(name, table, results_root)):
            stale.append(name)
    return stale


def write_tables(doc: Path, tables: dict[str, dict[str, Any]], results_root: Path) -> None:
    """Replace each table's region in ``doc``; a table without a region is refused (place its markers first)."""
    text = doc.read_text()
    for name, table in tables.items():
        region = _region(name, render_table(name, table, results_root))
        if not _pattern(name).search(text):
            raise ValueError(f"{doc} has no region for table {name}: add the two lines '<!-- campaign:{name} -->' "
                             f"and '<!-- /campaign:{name} -->' where it goes")
        text = _pattern(name).sub(lambda _, region=region: region, text)
    doc.write_text(text)
