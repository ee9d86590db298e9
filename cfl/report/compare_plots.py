"""Comparison figures of groups of runs (``cfl report RUN_DIRS --plots DIR``, ``cfl sweep``), each PNG (and PDF or
SVG on request) with a CSV of the same name holding its numbers (:mod:`cfl.report.compare_data`):

- ``acc_fgt``: ACC and FGT per group, a marker at the mean over seeds, error bars ± one sample std, dots the
  seeds;
- ``acc_vs_fgt``: ACC against FGT, one point per group with the same error bars;
- ``accuracy_curves``: mean accuracy over seen tasks against the global round, the mean over seeds with a
  min-max band over seeds, task boundaries dotted;
- ``acc_matrices``: the final accuracy matrices (mean over seeds) side by side.

Each group has its own colour, marker and line style (:func:`cfl.report.figure_style.looks`); legends are
display names plus the settings that differ between groups (:mod:`cfl.report.labels`); accuracy axes are fitted
to the data. :class:`cfl.report.figure_style.FigureOptions` chooses groups, their order, legend texts and
colours, the y range, the size and the extra formats.
"""

from __future__ import annotations

import math
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from matplotlib.lines import Line2D

from cfl.report.compare_data import (
    Row,
    Series,
    all_series,
    curve_rows,
    matrix_rows,
    summary_rows,
    task_layout,
    write_csv,
)
from cfl.report.drawable import drawn as figure
from cfl.report.figure_style import FigureOptions, Look, fitted_range, looks
from cfl.report.files import check_writable
from cfl.report.groups import Group, group_runs, load_runs
from cfl.report.plots import as_matrix, draw_matrix, fit_accuracy_axis, mark_tasks, plt, save, wrapped_title
from cfl.schema import ConfigError

SEED_SPREAD = "error bars: ± 1 sample std over seeds"


def wrap(name: str, width: int = 40) -> str:
    """A group label broken into lines for legends and tick labels (the CSVs keep it whole)."""
    return textwrap.fill(name, width, break_on_hyphens=False)


def legend_height(names: list[str], base: float) -> float:
    """A figure height (inches) that fits ``base`` and a legend of the wrapped names beside the axes."""
    return max(base, 1.0 + 0.16 * sum(wrap(n).count("\n") + 1.4 for n in names))


def common_title(drawn: list[Drawn]) -> str:
    """What all groups share (stream, partition) and how many runs there are."""
    groups = [d.series.group for d in drawn]
    streams = sorted({g.stream for g in groups})
    partitions = sorted({g.partition for g in groups})
    runs = sum(len(g.runs) for g in groups)
    return f"{' / '.join(streams)} · {' / '.join(partitions)} · {len(groups)} groups, {runs} runs"


@dataclass(frozen=True)
class Drawn:
    """A series as drawn: its legend text (after the style's ``label``) and look (after its ``color``)."""

    series: Series
    legend: str
    look: Look


def figure_size(options: FigureOptions, width: float, height: float) -> tuple[float, float]:
    return options.size or (width, height)


def plot_acc_fgt(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    names = [wrap(d.legend) for d in drawn]
    height = 1.6 + 0.25 * sum(n.count("\n") + 2 for n in names)
    fig, axes = plt.subplots(1, 2, figsize=figure_size(options, 9, height), layout="constrained", sharey=True)
    for ax, key, title in zip(axes, ("acc", "fgt"), ("ACC (%)", "FGT (%)"), strict=True):
        spread: list[float] = []
        for y, (d, r) in enumerate(zip(drawn, rows, strict=True)):
            mean, std, seeds = r[f"{key}_mean"], r[f"{key}_std"] or 0.0, d.series.group.values(key)
            ax.errorbar([mean], [y], xerr=[std], fmt=d.look.marker, color=d.look.color, ms=7, capsize=4)
            ax.plot(seeds, [y] * len(seeds), "k.", ms=4, alpha=0.7, label="seeds" if y == 0 else None)
            spread += [mean - std, mean + std, *seeds]
        ax.set_xlabel(title)
        if key == "acc":
            ax.set_xlim(*fitted_range(spread, options))
        else:
            ax.set_xlim(*fitted_range(spread, FigureOptions()))
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(drawn)), names)
    axes[0].set_ylim(len(drawn) - 0.5, -0.5)
    axes[1].legend(loc="best", fontsize=7)
    wrapped_title(fig, f"{common_title(drawn)}\nmarkers: mean over seeds; {SEED_SPREAD}; dots: seeds")
    return save(fig, path, options.formats)


def plot_acc_vs_fgt(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    size = figure_size(options, 7.5, legend_height([d.legend for d in drawn], 4.2))
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    handles = []
    for d, r in zip(drawn, rows, strict=True):
        ax.errorbar(r["fgt_mean"], r["acc_mean"], xerr=r["fgt_std"], yerr=r["acc_std"], fmt=d.look.marker,
                    color=d.look.color, ms=7, capsize=4)
        handles.append(Line2D([], [], color=d.look.color, marker=d.look.marker, ls="none", ms=7, label=wrap(d.legend)))
    ax.set_xlabel("FGT (%): forgetting, lower is better")
    ax.set_ylabel("ACC (%): higher is better")
    if options.y_range is not None:
        ax.set_ylim(*options.y_range)
    ax.margins(0.08)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    wrapped_title(fig, f"{common_title(drawn)}\npoints: mean over seeds; {SEED_SPREAD}")
    return save(fig, path, options.formats)


def plot_curves(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    size = figure_size(options, 8, legend_height([d.legend for d in drawn], 4.0))
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    values: list[float] = []
    for d in drawn:
        mine = [r for r in rows if r["group"] == d.series.name]
        if not mine:
            continue
        rounds = [r["round"] for r in mine]
        ax.plot(rounds, [r["mean"] for r in mine], color=d.look.color, ls=d.look.linestyle, marker=d.look.marker,
                markevery=max(1, len(rounds) // 8), ms=5, lw=1.3, label=wrap(d.legend))
        ax.fill_between(rounds, [r["min"] for r in mine], [r["max"] for r in mine], color=d.look.color,
                        alpha=0.2 if len(drawn) <= 4 else 0.08, lw=0)  # many bands: fainter, the lines stay clear
        values += [r["min"] for r in mine] + [r["max"] for r in mine]
    layout = task_layout([d.series.group for d in drawn])
    if layout is not None:
        mark_tasks(ax, *layout)
    else:  # groups with different task lengths: no common boundaries to draw
        ax.set_xlabel("communication round (no task boundaries: the groups' tasks differ)")
        ax.margins(x=0.02)
    fit_accuracy_axis(ax, values, options)
    ax.set_ylabel("mean accuracy over seen tasks (%)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    wrapped_title(fig, f"{common_title(drawn)}\nlines: mean over seeds; bands: min-max over seeds")
    return save(fig, path, options.formats)


def plot_matrices(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    shown = [d for d in drawn if any(r["group"] == d.series.name for r in rows)]
    names = [d.series.name for d in shown]
    titles = [wrap(f"{d.legend} ({max(r['runs'] for r in rows if r['group'] == d.series.name)} seeds)", 34)
              for d in shown]
    cols = min(4, len(names))
    lines = math.ceil(len(names) / cols)
    tasks = max(int(r["after_task"]) for r in rows) + 1
    cell = max(2.4, 0.42 * tasks + 1.0)
    title_height = 0.18 * max(t.count("\n") + 1 for t in titles)
    size = figure_size(options, cell * cols + 1.3, (cell + title_height) * lines + 0.8)
    fig, axes = plt.subplots(lines, cols, figsize=size, layout="constrained", squeeze=False)
    image: Any = None
    for ax, name, title in zip(axes.flat, names, titles, strict=False):
        mine = [r for r in rows if r["group"] == name]
        n = max(r["after_task"] for r in mine) + 1
        cells: list[list[float | None]] = [[None] * n for _ in range(n)]
        for r in mine:
            cells[r["after_task"]][r["evaluated_task"]] = r["mean"]
        image = draw_matrix(ax, as_matrix(cells), fontsize=6 if n > 6 else 7)
        ax.set_title(title, fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, label="accuracy (%)", shrink=0.8)  # "mean over seeds": in the title
    wrapped_title(fig, f"{common_title(shown)}\nfinal accuracy matrices, mean over seeds")
    return save(fig, path, options.formats)


def check_out_dir(path: Path) -> None:
    """Refuse a figures directory that is a file or cannot be made or written (exit code 2)."""
    try:
        check_writable(path)
    except ConfigError as err:
        raise ConfigError(f"{err}".replace("--out", "--plots")) from None


def write_figures(runs: list[str | Path], out_dir: Path, options: FigureOptions | None = None,
                  failed: list[str] | None = None) -> list[Path]:
    """The comparison figures of the groups of the runs under ``runs`` in ``out_dir``; prints what it wrote
    (a figure that fails is named on stderr and in ``failed``, and the others are written)."""
    files = write_comparison(group_runs(load_runs(runs)), out_dir, options or FigureOptions(), failed)
    print(f"figures: {out_dir}/ ({', '.join(f.name for f in files)})", flush=True)
    return files


def chosen(groups: list[Group], options: FigureOptions) -> list[Drawn]:
    """The groups to draw, in order, with legends and looks: all of them, or those the options list (an
    unknown name is refused, the others left out are named)."""
    series = all_series(groups)
    if options.groups is None:
        return [Drawn(s, s.legend, look) for s, look in zip(series, looks(len(series)), strict=True)]
    by_name = {s.name: s for s in series}
    unknown = [g.group for g in options.groups if g.group not in by_name]
    if unknown:
        raise ConfigError(f"figure style: no group {', '.join(map(repr, unknown))} among the runs; the groups are "
                          f"{', '.join(map(repr, by_name))} (as the table's method column names them)")
    listed = {g.group for g in options.groups}
    left_out = [s.name for s in series if s.name not in listed]
    if left_out:
        print(f"figures: left out (not in the style's groups): {', '.join(left_out)}", flush=True)
    return [Drawn(by_name[g.group], g.label or by_name[g.group].legend,
                  replace(look, color=g.color) if g.color is not None else look)
            for g, look in zip(options.groups, looks(len(options.groups)), strict=True)]


def write_comparison(groups: list[Group], out_dir: Path, options: FigureOptions | None = None,
                     failed: list[str] | None = None) -> list[Path]:
    """The comparison figures and their CSVs in ``out_dir`` (created); returns the files written (PNGs and
    CSVs; the PDF or SVG copies lie beside the PNGs). Every CSV is written; a figure that fails is named on stderr
    and in ``failed`` (:func:`cfl.report.drawable.drawn`) and the others are drawn."""
    options = options or FigureOptions()
    drawn = chosen(groups, options)
    out_dir.mkdir(parents=True, exist_ok=True)
    series = [d.series for d in drawn]
    summary, curves, matrices = summary_rows(series), curve_rows(series), matrix_rows(series)
    written: list[Path | None] = [
        write_csv(summary, out_dir / "acc_fgt.csv"),
        figure("acc_fgt.png", lambda: plot_acc_fgt(drawn, summary, out_dir / "acc_fgt.png", options), failed),
        write_csv(summary, out_dir / "acc_vs_fgt.csv"),
        figure("acc_vs_fgt.png", lambda: plot_acc_vs_fgt(drawn, summary, out_dir / "acc_vs_fgt.png", options),
               failed),
        write_csv(curves, out_dir / "accuracy_curves.csv")]
    if curves:
        written.append(figure("accuracy_curves.png",
                              lambda: plot_curves(drawn, curves, out_dir / "accuracy_curves.png", options), failed))
    else:
        print(f"cfl: warning: no accuracy_curves.png in {out_dir}: no run has a readable metrics.jsonl",
              file=sys.stderr)
    written.append(write_csv(matrices, out_dir / "acc_matrices.csv"))
    if matrices:
        written.append(figure("acc_matrices.png",
                              lambda: plot_matrices(drawn, matrices, out_dir / "acc_matrices.png", options), failed))
    return [path for path in written if path is not None]
