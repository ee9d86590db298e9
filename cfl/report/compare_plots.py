"""Comparison figures of groups of runs (``cfl report RUN_DIRS --plots DIR``, ``cfl sweep``), each PNG with a
CSV of the same name holding its numbers (:mod:`cfl.report.compare_data`):

- ``acc_fgt``: ACC and FGT per group, bars at the mean over seeds, error bars ± one sample std, dots the seeds;
- ``acc_vs_fgt``: ACC against FGT, one point per group with the same error bars;
- ``accuracy_curves``: mean accuracy over seen tasks against the global round, the mean over seeds with a
  min-max band over seeds, task boundaries dotted;
- ``acc_matrices``: the final accuracy matrices (mean over seeds) side by side.
"""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path
from typing import Any

from cfl.report.compare_data import Row, curve_rows, group_names, matrix_rows, summary_rows, task_layout, write_csv
from cfl.report.files import check_writable
from cfl.report.groups import Group, group_runs, load_runs
from cfl.report.plots import as_matrix, draw_matrix, mark_tasks, palette, plt, save, wrapped_title
from cfl.schema import ConfigError

SEED_SPREAD = "error bars: ± 1 sample std over seeds"


def wrap(name: str, width: int = 40) -> str:
    """A group label broken into lines for legends and tick labels (the CSVs keep it whole)."""
    return textwrap.fill(name, width, break_on_hyphens=False)


def legend_height(names: list[str], base: float) -> float:
    """A figure height (inches) that fits ``base`` and a legend of the wrapped names beside the axes."""
    return max(base, 1.0 + 0.16 * sum(wrap(n).count("\n") + 1.4 for n in names))


def common_title(groups: list[Group]) -> str:
    """What all groups share (stream, partition) and how many runs there are."""
    streams = sorted({g.stream for g in groups})
    partitions = sorted({g.partition for g in groups})
    runs = sum(len(g.runs) for g in groups)
    return f"{' / '.join(streams)} · {' / '.join(partitions)} · {len(groups)} groups, {runs} runs"


def plot_acc_fgt(groups: list[Group], rows: list[Row], path: Path) -> Path:
    names, colors = [wrap(r["group"]) for r in rows], palette(len(rows))
    height = 1.6 + 0.25 * sum(n.count("\n") + 2 for n in names)
    fig, axes = plt.subplots(1, 2, figsize=(9, height), layout="constrained", sharey=True)
    for ax, key, title in zip(axes, ("acc", "fgt"), ("ACC (%)", "FGT (%)"), strict=True):
        means = [r[f"{key}_mean"] for r in rows]
        ax.barh(range(len(rows)), means, xerr=[r[f"{key}_std"] for r in rows], color=colors, alpha=0.75,
                capsize=4)
        for y, g in enumerate(groups):
            values = g.values(key)
            ax.plot(values, [y] * len(values), "k.", ms=5, label="seeds" if y == 0 else None)
        ax.set_xlabel(title)
        ax.axvline(0, color="black", lw=0.6)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(rows)), names)
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right", fontsize=7)
    wrapped_title(fig, f"{common_title(groups)}\nbars: mean over seeds; {SEED_SPREAD}; dots: seeds")
    return save(fig, path)


def plot_acc_vs_fgt(groups: list[Group], rows: list[Row], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, legend_height([r["group"] for r in rows], 4.2)), layout="constrained")
    for r, color in zip(rows, palette(len(rows)), strict=True):
        ax.errorbar(r["fgt_mean"], r["acc_mean"], xerr=r["fgt_std"], yerr=r["acc_std"], fmt="o", color=color,
                    capsize=4, label=wrap(r["group"]))
    ax.set_xlabel("FGT (%): forgetting, lower is better")
    ax.set_ylabel("ACC (%): higher is better")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    wrapped_title(fig, f"{common_title(groups)}\npoints: mean over seeds; {SEED_SPREAD}")
    return save(fig, path)


def plot_curves(groups: list[Group], rows: list[Row], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, legend_height(group_names(groups), 4.0)), layout="constrained")
    for name, color in zip(group_names(groups), palette(len(groups)), strict=True):
        mine = [r for r in rows if r["group"] == name]
        rounds = [r["round"] for r in mine]
        ax.plot(rounds, [r["mean"] for r in mine], color=color, lw=1.3, label=wrap(name))
        ax.fill_between(rounds, [r["min"] for r in mine], [r["max"] for r in mine], color=color, alpha=0.2,
                        lw=0)
    layout = task_layout(groups)
    if layout is not None:
        mark_tasks(ax, *layout)
    else:  # groups with different task lengths: no common boundaries to draw
        ax.set_xlabel("communication round (no task boundaries: the groups' tasks differ)")
        ax.set_ylim(0, 100)
    ax.set_ylabel("mean accuracy over seen tasks (%)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    wrapped_title(fig, f"{common_title(groups)}\nlines: mean over seeds; bands: min-max over seeds")
    return save(fig, path)


def plot_matrices(groups: list[Group], rows: list[Row], path: Path) -> Path:
    names = [n for n in group_names(groups) if any(r["group"] == n for r in rows)]
    titles = [wrap(f"{n} ({max(r['runs'] for r in rows if r['group'] == n)} seeds)", 34) for n in names]
    cols = min(4, len(names))
    lines = math.ceil(len(names) / cols)
    size = max(int(r["after_task"]) for r in rows)
    cell = max(2.4, 0.42 * size + 1.0)
    title_height = 0.18 * max(t.count("\n") + 1 for t in titles)
    fig, axes = plt.subplots(lines, cols, figsize=(cell * cols + 1.3, (cell + title_height) * lines + 0.8),
                             layout="constrained", squeeze=False)
    image: Any = None
    for ax, name, title in zip(axes.flat, names, titles, strict=False):
        mine = [r for r in rows if r["group"] == name]
        n = max(r["after_task"] for r in mine)
        cells: list[list[float | None]] = [[None] * n for _ in range(n)]
        for r in mine:
            cells[r["after_task"] - 1][r["evaluated_task"] - 1] = r["mean"]
        image = draw_matrix(ax, as_matrix(cells), fontsize=6 if n > 6 else 7)
        ax.set_title(title, fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, label="accuracy (%), mean over seeds", shrink=0.8)
    wrapped_title(fig, f"{common_title(groups)}\nfinal accuracy matrices, mean over seeds")
    return save(fig, path)


def check_out_dir(path: Path) -> None:
    """Refuse a figures directory that is a file or cannot be made or written (exit code 2)."""
    try:
        check_writable(path)
    except ConfigError as err:
        raise ConfigError(f"{err}".replace("--out", "--plots")) from None


def write_figures(runs: list[str | Path], out_dir: Path) -> list[Path]:
    """The comparison figures of the groups of the runs under ``runs`` in ``out_dir``; prints what it wrote."""
    files = write_comparison(group_runs(load_runs(runs)), out_dir)
    print(f"figures: {out_dir}/ ({', '.join(f.name for f in files)})", flush=True)
    return files


def write_comparison(groups: list[Group], out_dir: Path) -> list[Path]:
    """The comparison PNGs and their CSVs in ``out_dir`` (created); returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary, curves, matrices = summary_rows(groups), curve_rows(groups), matrix_rows(groups)
    written = [write_csv(summary, out_dir / "acc_fgt.csv"), plot_acc_fgt(groups, summary, out_dir / "acc_fgt.png"),
               write_csv(summary, out_dir / "acc_vs_fgt.csv"),
               plot_acc_vs_fgt(groups, summary, out_dir / "acc_vs_fgt.png"),
               write_csv(curves, out_dir / "accuracy_curves.csv")]
    if curves:
        written.append(plot_curves(groups, curves, out_dir / "accuracy_curves.png"))
    else:
        print(f"cfl: warning: no accuracy_curves.png in {out_dir}: no run has a readable metrics.jsonl",
              file=sys.stderr)
    written.append(write_csv(matrices, out_dir / "acc_matrices.csv"))
    if matrices:
        written.append(plot_matrices(groups, matrices, out_dir / "acc_matrices.png"))
    return written
