"""A table's published numbers beside its records, and the ordering of its methods against the paper's.

A table of ``benchmarks/results/tables.yaml`` may name ``published``: a caption (where the numbers come from and
how that setting differs from the records') and, per method label, the paper's ACC and FGT (%). Its region in
docs/results.md then gets a second table: each recorded method's mean ACC and FGT over the seeds it has (the count
said in the row, never a mean over fewer seeds without saying so) beside the paper's, and two lines that order the
methods both ways by ACC, over the methods both have, with the pairs whose order differs named.
"""

from __future__ import annotations

from itertools import combinations
from statistics import mean
from typing import Any

from cfl.config.keys import ConfigError


def check_published(path: Any, name: str, published: Any) -> None:
    """``published``: ``{caption: TEXT, rows: {LABEL: {acc: NUMBER, fgt: NUMBER}}}``."""
    if published is None:
        return
    rows = published.get("rows") if isinstance(published, dict) else None
    caption = published.get("caption") if isinstance(published, dict) else None
    if not isinstance(caption, str) or not isinstance(rows, dict) or not rows:
        raise ConfigError(f"{path}: table {name!r}: 'published' must be {{caption: TEXT, rows: {{LABEL: {{acc: X, "
                          f"fgt: Y}}}}}}, got {published!r}")
    for label, row in rows.items():
        if not (isinstance(row, dict) and set(row) == {"acc", "fgt"}
                and all(isinstance(v, (int, float)) for v in row.values())):
            raise ConfigError(f"{path}: table {name!r}: published row {label!r} must be {{acc: X, fgt: Y}} (numbers, "
                              f"%), got {row!r}")


def _means(records: list[dict[str, Any]]) -> dict[str, tuple[float, float, list[int]]]:
    by_label: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_label.setdefault(r["config"].get("label") or r["method"], []).append(r)
    return {label: (mean(r["acc"] for r in rs), mean(r["fgt"] for r in rs), sorted(r["seed"] for r in rs))
            for label, rs in by_label.items()}


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _order(scores: dict[str, float]) -> list[str]:
    return sorted(scores, key=lambda label: -scores[label])


def published_text(published: dict[str, Any], records: list[dict[str, Any]], planned_seeds: list[int],
                   order: list[str]) -> str:
    """The comparison table and the two orderings (markdown)."""
    ours = _means(records)
    labels = list(dict.fromkeys([n for n in order if n in ours or n in published["rows"]]
                                + list(published["rows"]) + sorted(ours)))
    lines = [f"Beside the paper: {published['caption']}", "",
             "| method | seeds in | ACC (%) | paper ACC (%) | FGT (%) | paper FGT (%) |", "|---|---|---|---|---|---|"]
    for label in labels:
        paper = published["rows"].get(label)
        got = ours.get(label)
        seeds = (f"{len(got[2])} of {len(planned_seeds)} ({', '.join(map(str, got[2]))})" if got
                 else f"0 of {len(planned_seeds)}")
        lines.append(f"| {label} | {seeds} | {_cell(got and got[0])} | {_cell(paper and paper['acc'])} "
                     f"| {_cell(got and got[1])} | {_cell(paper and paper['fgt'])} |")
    both = [n for n in labels if n in ours and n in published["rows"]]
    lines.append("")
    if len(both) < 2:
        lines.append("Ordering against the paper's: not yet (fewer than two methods have both numbers).")
        return "\n".join(lines)
    mine = _order({n: ours[n][0] for n in both})
    theirs = _order({n: published["rows"][n]["acc"] for n in both})
    flipped = [f"{a}/{b}" for a, b in combinations(both, 2)
               if (mine.index(a) < mine.index(b)) != (theirs.index(a) < theirs.index(b))]
    lines.append(f"By ACC, here: {' > '.join(mine)}; in the paper: {' > '.join(theirs)} "
                 f"(over the {len(both)} methods with both; "
                 + (f"pairs in the other order: {', '.join(flipped)})." if flipped else "the same order).")
                 + (" Means over fewer seeds than planned are marked in 'seeds in'."
                    if any(len(ours[n][2]) < len(planned_seeds) for n in both) else ""))
    return "\n".join(lines)
