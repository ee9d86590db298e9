"""``cfl report``: one row per group of runs (:mod:`cfl.report.groups`), as Markdown, CSV or LaTeX.

Columns, chosen by key (``--columns``; :data:`COLUMN_KEYS`): stream, partition, method (the group's label), runs,
seeds, then mean ± sample standard deviation (``statistics.stdev``, divisor n - 1; a single run shows its value
alone: it has no spread) over the group's runs of ACC, FGT, BWT, AIA and FWT (%), rounds to each target accuracy
(when runs set ``target_accuracies``), per-class accuracy (class-incremental runs), under a schedule the means over
clients of each client's own ACC and FGT (``results.json``'s ``schedule``: ``client_acc_mean``, ``client_fgt_mean``;
docs/concepts.md, "Metrics under a schedule"), the rounds run, upload (in the largest of GiB, MiB, KiB and B in
which every run's upload reads at least 1: :func:`upload_unit`) and wall time (s).
The default (:data:`DEFAULT_COLUMNS`) leaves out BWT (it is -FGT), per-class accuracy and the rounds, and shows AIA,
FWT and the client means when a run has them.
Rounds to a target: per run, the mean over tasks of the rounds (from the task's start) until the task's
own accuracy reached it; a run with a task that never reached it is left out of the mean, and the cell
says of how many runs it is ("never reached": none did). A group none of whose runs set that target (others in
the table did) shows "no target set". CSV gives the mean and the std in columns of their own, at full precision.
Rows: :func:`cfl.report.row_order.order_rows` (FedAvg first by default, ``--order`` to choose).
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl.config.keys import ConfigError
from cfl.report.cells import Better, Cell, Column, Stat
from cfl.report.groups import Group, Run, group_runs, is_number, load_runs, mean_std
from cfl.report.latex_table import latex
from cfl.report.row_order import order_rows
from cfl.report.same_as_fedavg import MARK, footnote, mark_same_as_fedavg
from cfl.report.significance import DAGGER, Significance, significance

FORMATS = ("md", "csv", "latex")
#: a rounds-to-target cell of a group none of whose runs set that target (others in the table did)
NO_TARGET = "no target set"
GIB = 1024 ** 3
#: what ``--columns`` may name, in the default order; ``targets`` and ``class_acc`` are a column per target/class
COLUMN_KEYS = ("stream", "partition", "method", "runs", "seeds", "acc", "fgt", "bwt", "aia", "fwt", "client_acc",
               "client_fgt", "targets", "class_acc", "rounds", "upload", "wall")
DEFAULT_COLUMNS = ("stream", "partition", "method", "runs", "seeds", "acc", "fgt", "aia", "fwt", "client_acc",
                   "client_fgt", "targets", "upload", "wall")
#: in the default only when a run of the table has the value (older results have neither AIA nor FWT; FWT not
#: class-incremental; the client means only under a schedule other than the synchronous one)
SHOWN_WHEN_MEASURED = ("aia", "fwt", "client_acc", "client_fgt")
#: where a run keeps the value of a column of :data:`SHOWN_WHEN_MEASURED` other than a top-level result
SCHEDULE_MEANS = {"client_acc": "client_acc_mean", "client_fgt": "client_fgt_mean"}
#: ``--format latex``'s default, a paper's columns: stream and partition only where the rows differ in them
LATEX_COLUMNS = ("stream", "partition", "method", "acc", "fgt", "aia", "fwt", "targets", "upload")


@dataclass(frozen=True)
class TableOptions:
    """``columns``: keys of :data:`COLUMN_KEYS` (None: the default); ``order``: names to put first (None: FedAvg
    first when present); ``caption``, ``label``, ``layout`` and ``width``: LaTeX only
    (:mod:`cfl.report.latex_table`); ``reference`` and ``test``: :mod:`cfl.report.significance`; ``last_k``:
    :mod:`cfl.report.last_k`."""

    columns: tuple[str, ...] | None = None
    order: tuple[str, ...] | None = None
    caption: str | None = None
    label: str | None = None
    reference: str | None = None
    test: str = "t"
    last_k: int | None = None
    layout: str = "rows"
    width: str | None = None

    def check(self, fmt: str) -> None:
        """Refuse what would be ignored or is unknown, before any run is read."""
        if fmt not in RENDER:
            raise ConfigError(f"unknown report format '{fmt}' (one of {', '.join(FORMATS)})")
        unknown = [c for c in self.columns or () if c not in COLUMN_KEYS]
        if unknown:
            raise ConfigError(f"--columns: unknown column(s) {', '.join(repr(c) for c in unknown)}; the columns are "
                              f"{', '.join(COLUMN_KEYS)}")
        if self.columns is not None and not self.columns:
            raise ConfigError(f"--columns is empty; name some of {', '.join(COLUMN_KEYS)}")
        twice = sorted({c for c in self.columns or () if self.columns.count(c) > 1})
        if twice:
            raise ConfigError(f"--columns names {', '.join(repr(c) for c in twice)} more than once; name each "
                              "column once")
        from cfl.report.last_k import check_k
        from cfl.report.latex_table import LAYOUTS
        from cfl.report.significance import TESTS

        check_k(self.last_k)
        if self.test not in TESTS:
            raise ConfigError(f"--test must be one of {', '.join(TESTS)}, got {self.test!r}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"--layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if fmt != "latex":
            given = [f"--{k}" for k in ("caption", "label", "width") if getattr(self, k) is not None]
            given += ["--layout"] * (self.layout != "rows")
            if given:
                verb = "are" if len(given) > 1 else "is"
                raise ConfigError(f"{' and '.join(given)} {verb} read only with --format latex (this is --format "
                                  f"{fmt}): add --format latex or leave {' and '.join(given)} out")


def stat(group: Group, values: list[float], digits: int) -> Stat | None:
    ms = mean_std(values)
    return None if ms is None else Stat(ms[0], ms[1], len(values), len(group.runs), digits)


def result_column(title: str, key: str, better: Better, scale: float = 1.0, digits: int = 2,
                  result: bool = True) -> Column:
    """A column of ``results[key] / scale``; ``result``: a result of learning (bold, tested), not a cost."""
    def value(run: Run) -> float | None:
        v = run.results.get(key)
        return float(v) / scale if is_number(v) else None
    return values_column(title, value, better, digits, result)


def values_column(title: str, value: Callable[[Run], float | None], better: Better, digits: int = 2,
                  result: bool = True) -> Column:
    def cell(g: Group) -> Cell:
        return stat(g, [v for v in map(value, g.runs) if v is not None], digits)
    return Column(title, cell, numeric=True, better=better, value=value if result else None)


def schedule_mean(run: Run, key: str) -> float | None:
    """``results['schedule'][key]`` (a run under a schedule other than the synchronous one), else None."""
    value = (run.results.get("schedule") or {}).get(key)
    return float(value) if is_number(value) else None


def measured(run: Run, key: str) -> bool:
    """Whether the run has the value of column ``key`` (:data:`SHOWN_WHEN_MEASURED`)."""
    if key in SCHEDULE_MEANS:
        return schedule_mean(run, SCHEDULE_MEANS[key]) is not None
    return is_number(run.results.get(key))


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
    return Column(f"rounds to {target}%", cell, numeric=True, better="lower")


def targets(runs: list[Run]) -> list[str]:
    found = {t for r in runs for task in (r.results.get("rounds_to_target") or {}).values() for t in task}
    return sorted(found, key=float)


def class_column(cls: str) -> Column:
    """A class's accuracy (class-incremental runs' ``class_acc``) over the group's runs that have it."""
    def cell(g: Group) -> Cell:
        values = [float(r.results["class_acc"][cls]) for r in g.runs
                  if is_number((r.results.get("class_acc") or {}).get(cls))]
        return stat(g, values, 2)
    return Column(f"class {cls} (%)", cell, numeric=True, better="higher")


def classes(runs: list[Run]) -> list[str]:
    found = {c for r in runs for c in (r.results.get("class_acc") or {})}
    return sorted(found, key=lambda c: (len(c), c))  # numbers as numbers: 2 before 10


def acc_column(last_k: int | None) -> Column:
    """ACC, or with ``last_k`` the mean of each run's last k evaluations (:mod:`cfl.report.last_k`)."""
    if last_k is None:
        return result_column("ACC (%)", "acc", "higher")
    from cfl.report.last_k import last_k_mean

    return values_column(f"ACC last {last_k} (%)", lambda run: last_k_mean(run, last_k), "higher")


#: the units the upload column may read in, largest first
BYTE_UNITS = (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024), ("B", 1))


def upload_unit(runs: list[Run]) -> tuple[str, int]:
    """The largest unit in which every run's non-zero upload reads at least 1 (GiB for 0.002 GiB would show
    0.002, 3 decimals hiding a method's 2 MiB); GiB when no run has one."""
    sizes = [float(v) for v in (r.results.get("upload_bytes") for r in runs) if is_number(v) and v > 0]
    if not sizes:
        return BYTE_UNITS[0]
    return next((unit for unit in BYTE_UNITS if min(sizes) >= unit[1]), BYTE_UNITS[-1])


def upload_column(runs: list[Run]) -> Column:
    name, scale = upload_unit(runs)
    return result_column(f"upload ({name})", "upload_bytes", "lower", scale, 3, result=False)


def column_set(runs: list[Run], last_k: int | None = None) -> dict[str, list[Column]]:
    """The columns of each key of :data:`COLUMN_KEYS`."""
    return {
        "stream": [Column("stream", lambda g: g.stream)],
        "partition": [Column("partition", lambda g: g.partition)],
        "method": [Column("method", lambda g: f"{g.label} {MARK}" if g.same_as_fedavg else g.label)],
        "runs": [Column("runs", lambda g: str(len(g.runs)))],
        "seeds": [Column("seeds", lambda g: ",".join(map(str, g.seeds)))],
        "acc": [acc_column(last_k)],
        "fgt": [result_column("FGT (%)", "fgt", "lower")],
        "bwt": [result_column("BWT (%)", "bwt", "higher")],
        "aia": [result_column("AIA (%)", "aia", "higher")],
        "fwt": [result_column("FWT (%)", "fwt", "higher")],
        "client_acc": [values_column("client ACC (%)", lambda run: schedule_mean(run, "client_acc_mean"), "higher")],
        "client_fgt": [values_column("client FGT (%)", lambda run: schedule_mean(run, "client_fgt_mean"), "lower")],
        "targets": [target_column(t) for t in targets(runs)],
        "class_acc": [class_column(c) for c in classes(runs)],
        "rounds": [result_column("rounds", "rounds", "lower", digits=0, result=False)],
        "upload": [upload_column(runs)],
        "wall": [result_column("wall (s)", "wall_seconds", "lower", 1.0, 1, result=False)],
    }


def columns(runs: list[Run], keys: tuple[str, ...] | None = None, last_k: int | None = None,
            latex_groups: list[Group] | None = None) -> list[Column]:
    """The columns of ``keys`` (None: :data:`DEFAULT_COLUMNS`, or given ``latex_groups`` :data:`LATEX_COLUMNS`
    with stream and partition only where those groups differ in them; those of :data:`SHOWN_WHEN_MEASURED` only when
    a run has them)."""
    if keys is None:
        default = DEFAULT_COLUMNS if latex_groups is None else tuple(
            k for k in LATEX_COLUMNS if k not in ("stream", "partition")
            or len({getattr(g, k) for g in latex_groups}) > 1)
        keys = tuple(k for k in default
                     if k not in SHOWN_WHEN_MEASURED or any(measured(r, k) for r in runs))
    found = column_set(runs, last_k)
    return [c for k in keys for c in found[k]]


# ---- formats ----
def markdown(cols: list[Column], groups: list[Group], sig: Significance | None = None) -> str:
    def text(cell: Cell, mark: bool) -> str:
        if cell is None:
            return "–"
        return cell.replace("|", "\\|") if isinstance(cell, str) else cell.text() + f" {DAGGER}" * mark
    lines = ["| " + " | ".join(c.title for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(text(c.cell(g), sig is not None and sig.marked(i, k)) for k, c in enumerate(cols))
              + " |" for i, g in enumerate(groups)]
    if sig is not None and sig.ran:
        lines += ["", sig.note()]
    return "\n".join(lines)


def csv_text(cols: list[Column], groups: list[Group], sig: Significance | None = None) -> str:
    """Text cells as they are; a statistic as ``mean``, ``std`` and ``n`` (runs it is over) columns; where rows
    were tested against a reference, each result column's p-value (``... p``) and a last column naming the test."""
    tested = sig is not None and sig.ran
    rows = [[c.cell(g) for c in cols] for g in groups]
    header: list[str] = []
    for c in cols:
        header += [f"{c.title} mean", f"{c.title} std", f"{c.title} n"] if c.numeric else [c.title]
        header += [f"{c.title} p"] * (tested and c.value is not None)
    header += ["significance"] * tested
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for i, row in enumerate(rows):
        line: list[Any] = []
        for k, (cell, c) in enumerate(zip(row, cols, strict=True)):
            if not c.numeric:
                line.append(cell)
            else:
                line += [cell.mean, cell.std if cell.n > 1 else "", cell.n] if isinstance(cell, Stat) else ["", "", 0]
            if tested and c.value is not None:
                found = sig.results.get((i, k)) if sig is not None else None
                line.append("" if found is None or found.p is None else found.p)
        if sig is not None and tested:
            line.append(sig.describe(i, groups))
        writer.writerow(line)
    return out.getvalue().rstrip("\n")


RENDER = {"md": markdown, "csv": csv_text, "latex": latex}


def report_table(runs: list[Run], fmt: str = "md", options: TableOptions | None = None) -> str:
    options = options or TableOptions()
    options.check(fmt)
    groups = order_rows(group_runs(runs), None if options.order is None else list(options.order))
    mark_same_as_fedavg(groups)
    note = footnote(groups)
    cols = columns(runs, options.columns, options.last_k, groups if fmt == "latex" else None)
    sig = significance(cols, groups, options.reference, options.test)
    if fmt == "latex":
        table = latex(cols, groups, options.caption, options.label, sig, options.layout, options.width)
        return f"{table}\n% {note}" if note else table  # a LaTeX comment: the file still compiles
    if fmt == "csv":  # CSV stays one table: the note goes to stderr
        if note:
            print(f"cfl: note: {note}", file=sys.stderr)
        return csv_text(cols, groups, sig)
    text = markdown(cols, groups, sig)
    return f"{text}\n\n{note}" if note else text


def report(paths: list[str | Path], fmt: str = "md", options: TableOptions | None = None) -> str:
    """The table of every readable, complete run under ``paths`` (damaged ones skipped with a warning); bad
    options are refused before any file is read."""
    (options or TableOptions()).check(fmt)
    return report_table(load_runs(paths), fmt, options)
