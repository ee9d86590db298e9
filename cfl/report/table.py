"""``cfl report``: a Markdown table of ACC and FGT (mean ± std over seeds) from run directories."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def find_results(paths: list[str | Path]) -> list[Path]:
    """``results.json`` files in the given run directories (searched recursively) or given directly."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file() and p.name == "results.json":
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(p.rglob("results.json")))
        else:
            raise FileNotFoundError(f"no run directory or results.json at '{p}'")
    return found


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
    return report_table([json.loads(f.read_text()) for f in files])
