"""``cfl report``: one row per group of runs (:mod:`cfl.report.groups`), as Markdown, CSV or LaTeX.

Columns: stream, partition, method (the group's label), runs, seeds, then mean ± sample standard deviation
(``statistics.stdev``, divisor n - 1; a single run shows its value alone: it has no spread) over the
group's runs of ACC, FGT and BWT (%), rounds to each target accuracy (when runs set ``target_accuracies``),
upload (GiB) and wall time (s).
Rounds to a target: per run, the mean over tasks of the rounds (from the task's start) until the task's
own accuracy reached it; a run with a task that never reached it is left out of the mean, and the cell
says of how many runs it is ("never reached": none did). A group none of whose runs set that target (others in
the table did) shows "no target set". CSV gives the mean and the std in columns of their own, at full precision.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl.report.groups import Group, Run, group_runs, is_number, load_runs, mean_std

FORMATS = ("md", "csv", "latex")
#: a rounds-to-target cell of a group none of whose runs set that target (others in the table did)
NO_TARGET = "no target set"
GIB = 1024 ** 3


@dataclass(frozen=True)
class Stat:
    """Mean ± std over ``n`` of a group's ``of`` runs, shown with ``digits`` decimals."""

    mean: float
    std: float
    n: int
    of: int
    digits: int

    def text(self, pm: str = " ± ") -> str:
        left_out = f" ({self.n} of {self.of} runs)" if self.n < self.of else ""
        spread = f"{pm}{self.std:.{self.digits}f}" if self.n > 1 else ""  # one run: no std to show
        return f"{self.mean:.{self.digits}f}{spread}{left_out}"


Cell = str | Stat | None


@dataclass(frozen=True)
class Column:
    title: str
    cell: Callable[[Group], Cell]
    numeric: bool = False  # cells are Stat (or None)


def stat(group: Group, values: list[float], digits: int) -> Stat | None:
    ms = mean_std(values)
    return None if ms is None else Stat(ms[0], ms[1], len(values), len(group.runs), digits)


def result_column(title: str, key: str, scale: float = 1.0, digits: int = 2) -> Column:
    return Column(title, lambda g: stat(g, [v / scale for v in g.values(key)], digits), numeric=True)


def rounds_to(run: Run, target: str) -> float | None:
    """Mean over the run's tasks of the rounds to reach ``target``; None when a task never reached it."""
    per_task = [t.get(target) for t in (run.results.get("rounds_to_target") or {}).values()]
    if not per_task or not all(is_number(r) for r in per_task):
        return None
    return statistics.fmean(per_task)


def sets_target(run: Run, target: str) -> bool:
    """Whether the run measured the rounds to ``target`` (had it in its ``target_accuracies``)."""
    return any(target in task for task in (run.results.get("rounds_to_target") or {}).values())


def target_column(target: str) -> Column:
    def cell(g: Group) -> Cell:
        if not any(sets_target(run, target) for run in g.runs):
            return NO_TARGET
        reached = [r for r in (rounds_to(run, target) for run in g.runs) if r is not None]
        return stat(g, reached, 1) or "never reached"
    return Column(f"rounds to {target}%", cell, numeric=True)


def targets(runs: list[Run]) -> list[str]:
    found = {t for r in runs for task in (r.results.get("rounds_to_target") or {}).values() for t in task}
    return sorted(found, key=float)


def columns(runs: list[Run]) -> list[Column]:
    return [
        Column("stream", lambda g: g.stream),
        Column("partition", lambda g: g.partition),
        Column("method", lambda g: g.label),
        Column("runs", lambda g: str(len(g.runs))),
        Column("seeds", lambda g: ",".join(map(str, g.seeds))),
        result_column("ACC (%)", "acc"),
        result_column("FGT (%)", "fgt"),
        result_column("BWT (%)", "bwt"),
        *(target_column(t) for t in targets(runs)),
        result_column("upload (GiB)", "upload_bytes", GIB, 3),
        result_column("wall (s)", "wall_seconds", 1.0, 1),
    ]


# ---- formats ----
def markdown(cols: list[Column], groups: list[Group]) -> str:
    def text(cell: Cell) -> str:
        return "–" if cell is None else cell.replace("|", "\\|") if isinstance(cell, str) else cell.text()
    lines = ["| " + " | ".join(c.title for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(text(c.cell(g)) for c in cols) + " |" for g in groups]
    return "\n".join(lines)


def csv_text(cols: list[Column], groups: list[Group]) -> str:
    """Text cells as they are; a statistic as ``mean``, ``std`` and ``n`` (runs it is over) columns."""
    rows = [[c.cell(g) for c in cols] for g in groups]
    header: list[str] = []
    for c in cols:
        header += [f"{c.title} mean", f"{c.title} std", f"{c.title} n"] if c.numeric else [c.title]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        line: list[Any] = []
        for cell, c in zip(row, cols, strict=True):
            if not c.numeric:
                line.append(cell)
            else:
                line += [cell.mean, cell.std if cell.n > 1 else "", cell.n] if isinstance(cell, Stat) else ["", "", 0]
        writer.writerow(line)
    return out.getvalue().rstrip("\n")


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def latex(cols: list[Column], groups: list[Group]) -> str:
    """A ``tabular`` (no packages needed): text left-aligned, numbers right-aligned."""
    def text(cell: Cell) -> str:
        if cell is None:
            return "--"
        return latex_escape(cell) if isinstance(cell, str) else cell.text(r" $\pm$ ")
    align = "".join("r" if c.numeric else "l" for c in cols)
    lines = [f"\\begin{{tabular}}{{{align}}}", "\\hline",
             " & ".join(latex_escape(c.title) for c in cols) + " \\\\", "\\hline"]
    lines += [" & ".join(text(c.cell(g)) for c in cols) + " \\\\" for g in groups]
    lines += ["\\hline", "\\end{tabular}"]
    return "\n".join(lines)


RENDER = {"md": markdown, "csv": csv_text, "latex": latex}


def report_table(runs: list[Run], fmt: str = "md") -> str:
    if fmt not in RENDER:
        raise ValueError(f"unknown report format '{fmt}' (one of {', '.join(FORMATS)})")
    return RENDER[fmt](columns(runs), group_runs(runs))


def report(paths: list[str | Path], fmt: str = "md") -> str:
    """The table of every readable, complete run under ``paths`` (damaged ones skipped with a warning)."""
    return report_table(load_runs(paths), fmt)
