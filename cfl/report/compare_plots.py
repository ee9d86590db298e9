"""Comparison figures of groups of runs (``cfl report RUN_DIRS --plots DIR``, ``cfl sweep``), each PNG (and PDF or
SVG on request) with a CSV of the same name holding its numbers (:mod:`cfl.report.compare_data`):

- ``acc_fgt``: ACC and FGT per group, a marker at the mean over seeds, error bars ± one sample std, dots the
  seeds;
- ``acc_vs_fgt``: ACC against FGT, one point per group with the same error bars;
- ``accuracy_curves``: mean accuracy over seen tasks against the global round, the mean over seeds with a
  min-max band over seeds, task boundaries dotted;
- ``acc_matrices``: the final accuracy matrices (mean over seeds) side by side.

Groups that differ in stream (with its scenario) or partition are drawn in a panel per setting (``--facet``);
each method (legend text: display name plus the settings that tell it apart, :mod:`cfl.report.labels`) keeps one
colour, marker and line style in every panel and figure (:func:`cfl.report.figure_style.looks`, given in the
table's row order, which the legend follows); accuracy axes are fitted to the data. No figure has a title unless
asked (``--title``): what it shows is written beside it as ``NAME.txt``.
:class:`cfl.report.figure_style.FigureOptions` chooses groups, their order, legend texts and
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

from cfl.config.schema import ConfigError
from cfl.drawable import drawn as figure
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
from cfl.report.figure_style import FigureOptions, Look, fitted_range, looks
from cfl.report.files import check_writable
from cfl.report.groups import Group, group_runs, load_runs
from cfl.report.plots import as_matrix, draw_matrix, fit_accuracy_axis, mark_tasks, plt, save, wrapped_title

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
    """A series as drawn: its legend text (after the style's ``label``) and look (after its ``color``); the
    look is its method's (its legend text's), the same in every panel and figure."""

    series: Series
    legend: str
    look: Look


def figure_size(options: FigureOptions, width: float, height: float) -> tuple[float, float]:
    return options.size or (width, height)


def panels(drawn: list[Drawn]) -> list[tuple[str, list[Drawn]]]:
    """The panels (facet title, its series in row order), in the order of the rows."""
    found: dict[str, list[Drawn]] = {}
    for d in drawn:
        found.setdefault(d.series.facet, []).append(d)
    return list(found.items())


def panel_grid(n: int) -> tuple[int, int]:
    """Rows and columns of ``n`` panels: up to 3 side by side."""
    cols = min(n, 3)
    return math.ceil(n / cols), cols


def method_handles(drawn: list[Drawn], line: bool) -> list[Line2D]:
    """One legend entry per method (legend text), in row order: its colour, marker (and line style)."""
    first = {d.legend: d for d in reversed(drawn)}
    return [Line2D([], [], color=d.look.color, marker=d.look.marker, ls=d.look.linestyle if line else "none", ms=6,
                   label=wrap(d.legend)) for d in (first[name] for name in dict.fromkeys(d.legend for d in drawn))]


def method_legend(fig: Any, drawn: list[Drawn], line: bool) -> None:
    fig.legend(handles=method_handles(drawn, line), loc="outside right center", fontsize=7, frameon=False)


def title(fig: Any, caption: str, options: FigureOptions) -> None:
    """The title asked for (``--title``): none by default (the caption is in the sidecar ``.txt``)."""
    if options.title is not None:
        wrapped_title(fig, options.title or caption)


def caption_of(name: str, drawn: list[Drawn], options: FigureOptions) -> str:
    """What a figure shows, for its sidecar ``NAME.txt`` (and ``--title`` without text)."""
    smoothing = f"; each run's curve averaged over its last {options.last_k} evaluations" if options.last_k else ""
    what = {"acc_fgt": f"markers: mean over seeds; {SEED_SPREAD}; dots: seeds",
            "acc_vs_fgt": f"points: mean over seeds; {SEED_SPREAD}",
            "accuracy_curves": f"lines: mean over seeds; bands: min-max over seeds{smoothing}",
            "acc_matrices": "final accuracy matrices, mean over seeds"}[name]
    return f"{common_title(drawn)}\n{what}"


def plot_acc_fgt(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    row_of = {d.series.name: r for d, r in zip(drawn, rows, strict=True)}
    parts = panels(drawn)
    sizes = [sum(wrap(d.legend).count("\n") + 2 for d in mine) for _, mine in parts]
    height = 1.2 + 0.25 * sum(sizes) + 0.35 * len(parts) * bool(parts[0][0])
    fig, axes = plt.subplots(len(parts), 2, figsize=figure_size(options, 9, height), layout="constrained",
                             sharex="col", squeeze=False, gridspec_kw={"height_ratios": sizes})
    spreads: dict[str, list[float]] = {"acc": [], "fgt": []}
    for (facet, mine), pair in zip(parts, axes, strict=True):
        for ax, key in zip(pair, ("acc", "fgt"), strict=True):
            for y, d in enumerate(mine):
                r = row_of[d.series.name]
                mean, std, seeds = r[f"{key}_mean"], r[f"{key}_std"] or 0.0, d.series.group.values(key)
                ax.errorbar([mean], [y], xerr=[std], fmt=d.look.marker, color=d.look.color, ms=7, capsize=4)
                ax.plot(seeds, [y] * len(seeds), "k.", ms=4, alpha=0.7, label="seeds" if y == 0 else None)
                spreads[key] += [mean - std, mean + std, *seeds]
            ax.grid(axis="x", alpha=0.3)
        pair[0].set_yticks(range(len(mine)), [wrap(d.legend) for d in mine])
        pair[0].set_ylim(len(mine) - 0.5, -0.5)
        pair[1].set_ylim(len(mine) - 0.5, -0.5)
        pair[1].set_yticks(range(len(mine)), [""] * len(mine))
        if facet:
            pair[0].set_title(facet, loc="left", fontsize=9)
    axes[-1][0].set_xlabel("ACC (%)")
    axes[-1][1].set_xlabel("FGT (%)")
    axes[0][0].set_xlim(*fitted_range(spreads["acc"], options))
    axes[0][1].set_xlim(*fitted_range(spreads["fgt"], FigureOptions()))
    axes[0][1].legend(loc="best", fontsize=7)
    title(fig, caption_of("acc_fgt", drawn, options), options)
    return save(fig, path, options.formats)


def plot_acc_vs_fgt(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    row_of = {d.series.name: r for d, r in zip(drawn, rows, strict=True)}
    parts = panels(drawn)
    lines, cols = panel_grid(len(parts))
    height = legend_height(list(dict.fromkeys(d.legend for d in drawn)), 3.6 * lines + 0.6)
    fig, axes = plt.subplots(lines, cols, figsize=figure_size(options, 3.6 * cols + 2.8, height),
                             layout="constrained", sharex=True, sharey=True, squeeze=False)
    for ax, (facet, mine) in zip(axes.flat, parts, strict=False):
        for d in mine:
            r = row_of[d.series.name]
            ax.errorbar(r["fgt_mean"], r["acc_mean"], xerr=r["fgt_std"], yerr=r["acc_std"], fmt=d.look.marker,
                        color=d.look.color, ms=7, capsize=4)
        ax.grid(alpha=0.3)
        ax.margins(0.08)
        if facet:
            ax.set_title(facet, fontsize=9)
    for ax in list(axes.flat)[len(parts):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("FGT (%): forgetting, lower is better")
    for ax in axes[:, 0]:
        ax.set_ylabel("ACC (%): higher is better")
    if options.y_range is not None:
        axes[0][0].set_ylim(*options.y_range)
    method_legend(fig, drawn, line=False)
    title(fig, caption_of("acc_vs_fgt", drawn, options), options)
    return save(fig, path, options.formats)


def plot_curves(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    parts = panels(drawn)
    lines, cols = panel_grid(len(parts))
    height = legend_height(list(dict.fromkeys(d.legend for d in drawn)), 3.4 * lines + 0.6)
    width = 6.0 if len(parts) == 1 else 4.2 * cols
    fig, axes = plt.subplots(lines, cols, figsize=figure_size(options, width + 2.2, height), layout="constrained",
                             sharey=True, squeeze=False)
    values: list[float] = []
    for ax, (facet, mine) in zip(axes.flat, parts, strict=False):
        for d in mine:
            points = [r for r in rows if r["group"] == d.series.name]
            if not points:
                continue
            rounds = [r["round"] for r in points]
            ax.plot(rounds, [r["mean"] for r in points], color=d.look.color, ls=d.look.linestyle,
                    marker=d.look.marker, markevery=max(1, len(rounds) // 8), ms=5, lw=1.3, label=wrap(d.legend))
            ax.fill_between(rounds, [r["min"] for r in points], [r["max"] for r in points], color=d.look.color,
                            alpha=0.2 if len(mine) <= 4 else 0.08, lw=0)  # many bands: fainter, lines stay clear
            values += [r["min"] for r in points] + [r["max"] for r in points]
        layout = task_layout([d.series.group for d in mine])
        if layout is not None:
            mark_tasks(ax, *layout)
        else:  # groups with different task lengths: no common boundaries to draw
            ax.set_xlabel("communication round (no task boundaries: the groups' tasks differ)")
            ax.margins(x=0.02)
        if facet:
            ax.set_title(facet, fontsize=9, pad=14 if layout is not None else 4)
    for ax in list(axes.flat)[len(parts):]:
        ax.set_visible(False)
    for ax in list(axes.flat)[:len(parts)]:
        fit_accuracy_axis(ax, values, options)
    for ax in axes[:, 0]:
        ax.set_ylabel("mean accuracy over seen tasks (%)")
    method_legend(fig, drawn, line=True)
    title(fig, caption_of("accuracy_curves", drawn, options), options)
    return save(fig, path, options.formats)


def plot_matrices(drawn: list[Drawn], rows: list[Row], path: Path, options: FigureOptions) -> Path:
    shown = [d for d in drawn if any(r["group"] == d.series.name for r in rows)]
    names = [d.series.name for d in shown]
    titles = ["\n".join([*([d.series.facet] if d.series.facet else []), wrap(
        f"{d.legend} ({max(r['runs'] for r in rows if r['group'] == d.series.name)} seeds)", 34)]) for d in shown]
    cols = min(4, len(names))
    lines = math.ceil(len(names) / cols)
    tasks = max(int(r["after_task"]) for r in rows) + 1
    cell = max(2.4, 0.42 * tasks + 1.0)
    title_height = 0.18 * max(t.count("\n") + 1 for t in titles)
    size = figure_size(options, cell * cols + 1.3, (cell + title_height) * lines + 0.8)
    fig, axes = plt.subplots(lines, cols, figsize=size, layout="constrained", squeeze=False)
    image: Any = None
    for ax, name, text in zip(axes.flat, names, titles, strict=False):
        mine = [r for r in rows if r["group"] == name]
        n = max(r["after_task"] for r in mine) + 1
        cells: list[list[float | None]] = [[None] * n for _ in range(n)]
        for r in mine:
            cells[r["after_task"]][r["evaluated_task"]] = r["mean"]
        image = draw_matrix(ax, as_matrix(cells), fontsize=6 if n > 6 else 7)
        ax.set_title(text, fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, label="accuracy (%)", shrink=0.8)  # "mean over seeds": in the caption
    title(fig, caption_of("acc_matrices", shown, options), options)
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
    """The groups to draw, in the table's row order (``options.order``; FedAvg first by default) or the style's,
    with legends and looks: one look per method (legend text) in every panel, from the palette in row order or the
    style's ``color``; an unknown group in the style is refused, the groups it leaves out are named."""
    from cfl.report.row_order import order_rows

    series = all_series(order_rows(groups, None if options.order is None else list(options.order)), options.facet)
    if options.groups is None:
        picked = [(s, s.legend, None) for s in series]
    else:
        by_name = {s.name: s for s in series}
        unknown = [g.group for g in options.groups if g.group not in by_name]
        if unknown:
            raise ConfigError(f"figure style: no group {', '.join(map(repr, unknown))} among the runs; the groups "
                              f"are {', '.join(map(repr, by_name))} (as the table's method column names them)")
        listed = {g.group for g in options.groups}
        left_out = [s.name for s in series if s.name not in listed]
        if left_out:
            print(f"figures: left out (not in the style's groups): {', '.join(left_out)}", flush=True)
        picked = [(by_name[g.group], g.label or by_name[g.group].legend, g.color) for g in options.groups]
    if options.facet == "none":  # one panel: every group its own look, as in the legend
        keys = [s.name for s, _, _ in picked]
    else:
        keys = [legend for _, legend, _ in picked]
    look_of = dict(zip(dict.fromkeys(keys), looks(len(set(keys))), strict=True))
    for key, (_, _, color) in zip(keys, picked, strict=True):
        if color is not None:
            look_of[key] = replace(look_of[key], color=color)
    return [Drawn(s, legend, look_of[key]) for key, (s, legend, _) in zip(keys, picked, strict=True)]


def write_comparison(groups: list[Group], out_dir: Path, options: FigureOptions | None = None,
                     failed: list[str] | None = None) -> list[Path]:
    """The comparison figures and their CSVs in ``out_dir`` (created); returns the files written (PNGs and
    CSVs; the PDF or SVG copies lie beside the PNGs). Every CSV is written; a figure that fails is named on stderr
    and in ``failed`` (:func:`cfl.drawable.drawn`) and the others are drawn."""
    options = options or FigureOptions()
    drawn = chosen(groups, options)
    out_dir.mkdir(parents=True, exist_ok=True)
    series = [d.series for d in drawn]
    summary, curves, matrices = summary_rows(series), curve_rows(series, options.last_k), matrix_rows(series)
    for name in ("acc_fgt", "acc_vs_fgt", "accuracy_curves", "acc_matrices"):  # what each figure shows
        (out_dir / f"{name}.txt").write_text(caption_of(name, drawn, options) + "\n")
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
