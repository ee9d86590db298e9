"""The numbers behind the comparison figures, per group of runs (:mod:`cfl.report.groups`), as CSV rows; each
row's ``group`` is the group as the report's table names it (what a style file's ``groups`` entries name).

Spreads over seeds: ``*_std`` is the sample standard deviation (divisor n - 1, 0 for one seed), as in the
``cfl report`` table; the accuracy curves' band is the minimum and maximum over seeds at each round.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl.report.groups import Group, mean_std
from cfl.report.labels import row_label, short_keys
from cfl.report.last_k import read_mean_accuracy, trailing_means

Row = dict[str, Any]


@dataclass(frozen=True)
class Series:
    """A group as a figure shows it: ``name`` as the table names it, ``legend`` its legend text within its panel
    (the same for a method in every panel: its colour and marker follow it), ``facet`` its panel's title ("": one
    panel)."""

    name: str
    legend: str
    group: Group
    facet: str = ""


def faceted(groups: list[Group], facet: str = "none") -> tuple[bool, bool]:
    """Whether panels split by stream and by partition: ``auto`` by each that differs among the groups,
    ``stream`` or ``partition`` by that one (where it differs), ``none`` by neither."""
    streams, partitions = len({g.stream for g in groups}) > 1, len({g.partition for g in groups}) > 1
    return (streams and facet in ("auto", "stream"), partitions and facet in ("auto", "partition"))


def _prefixes(groups: list[Group], by: tuple[bool, bool] = (False, False)) -> list[list[str]]:
    """Per group, its stream and partition where those are not the same in all groups (nor panels of their own)."""
    streams = {g.stream for g in groups}
    partitions = {g.partition for g in groups}
    return [[g.stream] * (len(streams) > 1 and not by[0]) + [g.partition] * (len(partitions) > 1 and not by[1])
            for g in groups]


def group_names(groups: list[Group]) -> list[str]:
    """Each group's label, prefixed with the stream and partition when those are not the same in all groups."""
    return [" ".join([*prefix, g.label]) for prefix, g in zip(_prefixes(groups), groups, strict=True)]


def legend_names(groups: list[Group], by: tuple[bool, bool] = (False, False)) -> list[str]:
    """As :func:`group_names` with display names and short keys (``FedProx mu=1``), less the settings that have
    panels of their own (``by``: stream, partition)."""
    short = short_keys(sorted({k for g in groups for k in g.differs}))
    return [" ".join([*prefix, legend(g, short)]) for prefix, g in zip(_prefixes(groups, by), groups, strict=True)]


def legend(group: Group, short: dict[str, str]) -> str:
    """A group's display label: its method's display name (or config ``label``) and short ``key=value``s."""
    return row_label(group.method, group.differs, group.name, display=True, shortened=short, recorded=group.recorded)


def all_series(groups: list[Group], facet: str = "none") -> list[Series]:
    """The groups as series, in the given order, with panels by ``facet`` (:func:`faceted`)."""
    by = faceted(groups, facet)
    panels = [" · ".join([g.stream] * by[0] + [g.partition] * by[1]) for g in groups]
    return [Series(n, legend, g, panel) for n, legend, g, panel in zip(group_names(groups), legend_names(groups, by),
                                                                        groups, panels, strict=True)]


def summary_rows(series: list[Series]) -> list[Row]:
    """Per group: seeds, ACC and FGT mean and sample std over seeds (%)."""
    rows = []
    for name, g in ((s.name, s.group) for s in series):
        row: Row = {"group": name, "stream": g.stream, "partition": g.partition, "method": g.method,
                    "seeds": " ".join(map(str, g.seeds)), "runs": len(g.runs)}
        for key in ("acc", "fgt"):
            row[f"{key}_mean"], row[f"{key}_std"] = mean_std(g.values(key)) or (None, None)
        rows.append(row)
    return rows


def curve_rows(series: list[Series], last_k: int | None = None) -> list[Row]:
    """Per group and evaluated round: mean, min and max over seeds of the mean accuracy over seen tasks (%), each
    run's curve first averaged over its last ``last_k`` evaluations at each round (:mod:`cfl.report.last_k`).

    Only rounds evaluated in every run of the group that has a readable ``metrics.jsonl`` count."""

    rows = []
    for name, g in ((s.name, s.group) for s in series):
        curves = [c if last_k is None else trailing_means(c, last_k)
                  for c in map(read_mean_accuracy, g.runs) if c is not None]
        if not curves:
            continue
        for rnd in sorted(set.intersection(*(set(c) for c in curves))):
            values = [c[rnd] for c in curves]
            rows.append({"group": name, "round": rnd, "mean": statistics.fmean(values), "min": min(values),
                         "max": max(values), "runs": len(values)})
    return rows


def matrix_rows(series: list[Series]) -> list[Row]:
    """Per group and cell a[i][j] of the final accuracy matrix (after training task i, on task j, both from 0
    as in ``results.json``): mean and sample std over seeds (%)."""
    rows = []
    for name, g in ((s.name, s.group) for s in series):
        matrices = [r.results["acc_matrix"] for r in g.runs if isinstance(r.results.get("acc_matrix"), list)]
        if not matrices:
            continue
        for i, row in enumerate(matrices[0]):
            for j in range(len(row)):
                values = [float(m[i][j]) for m in matrices if m[i][j] is not None]
                if values:
                    mean, std = mean_std(values) or (None, None)
                    rows.append({"group": name, "after_task": i, "evaluated_task": j, "mean": mean,
                                 "std": std, "runs": len(values)})
    return rows


def task_layout(groups: list[Group]) -> tuple[int, int] | None:
    """(tasks, rounds per task) when all groups share them (for task boundaries), else None."""
    layouts = {(int(r.results["num_tasks"]), int(r.config["rounds_per_task"])) for g in groups for r in g.runs
               if "num_tasks" in r.results and "rounds_per_task" in r.config}
    return layouts.pop() if len(layouts) == 1 else None


def write_csv(rows: list[Row], path: Path) -> Path:
    import csv

    columns = list(rows[0]) if rows else ["group"]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, columns)
        writer.writeheader()
        writer.writerows(rows)
    return path
