"""``cfl report``: a Markdown table of ACC and FGT (mean ± std over seeds) from run directories.

The ± is the sample standard deviation (``statistics.stdev``, divisor n - 1); one seed shows ± 0.00.
A ``results.json`` that cannot be read or lacks a field of the table is skipped with a warning.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def find_results(paths: list[str | Path]) -> list[Path]:
    """``results.json`` files in the given run directories (searched recursively) or given directly,
    each once however often (and under whatever name) its directory is given."""
    found: dict[Path, Path] = {}
    for p in map(Path, paths):
        if p.is_file() and p.name == "results.json":
            files = [p]
        elif p.is_dir():
            files = sorted(p.rglob("results.json"))
        else:
            raise FileNotFoundError(f"no run directory or results.json at '{p}'")
        for f in files:
            found.setdefault(f.resolve(), f)
    return list(found.values())


TEXT_FIELDS = ("stream", "partition", "method")
NUMBER_FIELDS = ("acc", "fgt")


def read_results(path: Path) -> dict[str, Any] | None:
    """One run's results, or None (with a warning naming the file) when it is damaged or incomplete."""
    try:
        results = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return _skip(path, f"unreadable ({type(err).__name__}: {err})")
    if not isinstance(results, dict):
        return _skip(path, "not a JSON object")
    bad = [k for k in TEXT_FIELDS if not isinstance(results.get(k), str)]
    bad += [k for k in ("seed",) if not isinstance(results.get(k), int) or isinstance(results.get(k), bool)]
    bad += [k for k in NUMBER_FIELDS if not _is_number(results.get(k))]
    if bad:
        return _skip(path, f"missing or invalid {', '.join(repr(k) for k in bad)}")
    return results


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _skip(path: Path, why: str) -> None:
    print(f"cfl: warning: skipped {path}: {why}", file=sys.stderr)
    return None


def _fmt(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def report_table(results: list[dict[str, Any]]) -> str:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r.get("complete", True):
            groups[(r["stream"], r["partition"], r["method"])].append(r)
    lines = ["| stream | partition | method | seeds | ACC (%) | FGT (%) |", "|---|---|---|---|---|---|"]
    for (stream, part, method), runs in sorted(groups.items()):
        seeds = ",".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"]))
        lines.append(f"| {stream} | {part} | {method} | {seeds} | {_fmt([r['acc'] for r in runs])} | "
                     f"{_fmt([r['fgt'] for r in runs])} |")
    return "\n".join(lines)


def report(paths: list[str | Path]) -> str:
    files = find_results(paths)
    if not files:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, paths))}")
    results = [r for r in map(read_results, files) if r is not None]
    if not results:
        raise FileNotFoundError(f"no readable results.json under {', '.join(map(str, paths))} (see the warnings)")
    return report_table(results)
