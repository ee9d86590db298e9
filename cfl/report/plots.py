"""PNG plots of a run: the accuracy-matrix heatmap, mean accuracy over rounds and each task's accuracy over rounds.

Every figure is titled with :func:`cfl.report.labels.run_title` (stream and scenario, method with its
non-default parameters, partition with its parameters, seed). Round axes have their ticks at the task
boundaries, dotted lines there and ``task t`` above each task's span; accuracy axes are fitted to the data
with a margin, so a curve at 100 % is not drawn on the frame and the last marker is not clipped. Tasks are
numbered from 0, as in ``results.json``, ``metrics.jsonl`` and W&B (docs/concepts.md, "Task numbering").
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from cfl.drawable import PNG_DPI, drawn  # noqa: E402
from cfl.report.figure_style import FigureOptions, fitted_range, looks  # noqa: E402
from cfl.report.labels import run_title  # noqa: E402

PLOT_FILES = ("acc_matrix.png", "accuracy_curve.png", "task_accuracy.png")
DPI = PNG_DPI


def save(fig: Figure, path: Path, formats: tuple[str, ...] = ()) -> Path:
    """``path`` (a PNG) and the same figure beside it in each of ``formats`` (``pdf``, ``svg``)."""
    fig.savefig(path, dpi=DPI)
    for fmt in formats:
        fig.savefig(path.with_suffix(f".{fmt}"))
    plt.close(fig)
    return path


def wrapped_title(fig: Figure, text: str, fontsize: float = 9) -> None:
    """A figure title wrapped to the figure's width (constrained layout keeps it clear of the axes)."""
    chars = max(20, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    fig.suptitle("\n".join(line for part in text.split("\n") for line in textwrap.wrap(part, chars)),
                 fontsize=fontsize)


def as_matrix(acc_matrix: list[list[float | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in acc_matrix], dtype=float)


def draw_matrix(ax: Axes, matrix: np.ndarray, fontsize: float = 7) -> Any:
    """The heatmap of one accuracy matrix on ``ax``, each cell labelled; returns the image (for a colorbar)."""
    n = matrix.shape[0]
    im = ax.imshow(matrix, vmin=0, vmax=100, cmap="viridis")
    for i in range(n):
        for j in range(n):
            if not np.isnan(matrix[i, j]):
                ax.text(j, i, f"{matrix[i, j]:.0f}", ha="center", va="center", fontsize=fontsize,
                        color="white" if matrix[i, j] < 60 else "black")
    ax.set_xlabel("evaluated task")
    ax.set_ylabel("after training task")
    ax.set_xticks(range(n), [str(j) for j in range(n)])
    ax.set_yticks(range(n), [str(i) for i in range(n)])
    return im


def plot_matrix(results: dict[str, Any], path: Path) -> Path:
    matrix = as_matrix(results["acc_matrix"])
    n = matrix.shape[0]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.8 + 0.5 * n), max(3.6, 1.6 + 0.5 * n)), layout="constrained")
    im = draw_matrix(ax, matrix)
    fig.colorbar(im, ax=ax, label="accuracy (%)")
    wrapped_title(fig, f"{run_title(results)}\nACC {results['acc']:.2f} %, FGT {results['fgt']:.2f} %")
    return save(fig, path)


def mark_tasks(ax: Axes, num_tasks: int, rounds_per_task: int) -> None:
    """Ticks and dotted lines at the task boundaries, "task t" (from 0) above each span; the round axis runs
    from 0 to a little past the last round, so the last marker is whole."""
    total = num_tasks * rounds_per_task
    for t in range(1, num_tasks):
        ax.axvline(t * rounds_per_task, color="grey", ls=":", lw=0.8)
    if num_tasks <= 12:
        for t in range(num_tasks):
            ax.text((t + 0.5) * rounds_per_task, 1.01, f"task {t}", transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7, color="grey")
    step = max(1, math.ceil(num_tasks / 12))  # at most 13 ticks
    ax.set_xticks([t * rounds_per_task for t in range(0, num_tasks + 1, step)])
    ax.set_xlim(0, total + max(0.5, 0.015 * total))
    ax.set_xlabel("communication round (ticks: task boundaries)")
    ax.grid(alpha=0.3)


def fit_accuracy_axis(ax: Axes, values: list[float], options: FigureOptions | None = None) -> None:
    """The y axis fitted to ``values`` (or the option's range): :func:`cfl.report.figure_style.fitted_range`."""
    ax.set_ylim(*fitted_range(values, options or FigureOptions()))


def plot_curve(evaluations: list[dict[str, Any]], rounds_per_task: int, num_tasks: int, title: str,
               path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    values = [e["mean_acc"] for e in evaluations]
    ax.plot([e["round"] for e in evaluations], values, marker=".", lw=1.2)
    mark_tasks(ax, num_tasks, rounds_per_task)
    fit_accuracy_axis(ax, values)
    ax.set_ylabel("mean accuracy over seen tasks (%)")
    wrapped_title(fig, title)
    return save(fig, path)


def task_curves(evaluations: list[dict[str, Any]], num_tasks: int) -> list[tuple[list[int], list[float]]]:
    """Per task: the rounds at which it was evaluated and its accuracy there (empty before it is seen)."""
    curves: list[tuple[list[int], list[float]]] = [([], []) for _ in range(num_tasks)]
    for e in evaluations:
        for task, acc in e["acc"].items():
            curves[int(task)][0].append(e["round"])
            curves[int(task)][1].append(acc)
    return curves


def plot_task_curves(evaluations: list[dict[str, Any]], rounds_per_task: int, num_tasks: int, title: str,
                     path: Path) -> Path:
    """Each task's test accuracy over rounds, from the round it is first trained on."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8), layout="constrained")
    curves = task_curves(evaluations, num_tasks)
    for t, ((rounds, accs), look) in enumerate(zip(curves, looks(num_tasks), strict=True)):
        ax.plot(rounds, accs, marker=look.marker if len(rounds) < 60 else None, ms=3, lw=1.2, color=look.color,
                ls=look.linestyle, label=f"task {t}")
    mark_tasks(ax, num_tasks, rounds_per_task)
    fit_accuracy_axis(ax, [a for _, accs in curves for a in accs])
    ax.set_ylabel("test accuracy of the task (%)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, ncol=1 if num_tasks <= 12 else 2,
              frameon=False)
    wrapped_title(fig, title)
    return save(fig, path)


def write_plots(results: dict[str, Any], evaluations: list[dict[str, Any]], rounds_per_task: int,
                out_dir: Path, failed: list[str] | None = None) -> list[Path]:
    """The run's PNGs (:data:`PLOT_FILES`) in ``out_dir`` that could be drawn (one that fails is named on stderr
    and in ``failed``, and the others are still drawn: :func:`cfl.drawable.drawn`); none for a run that
    finished no task."""
    if results["acc"] is None:
        return []
    title, n = run_title(results), results["num_tasks"]
    figures = [
        lambda: plot_matrix(results, out_dir / PLOT_FILES[0]),
        lambda: plot_curve(evaluations, rounds_per_task, n, title, out_dir / PLOT_FILES[1]),
        lambda: plot_task_curves(evaluations, rounds_per_task, n, title, out_dir / PLOT_FILES[2]),
    ]
    written = [drawn(name, draw, failed) for name, draw in zip(PLOT_FILES, figures, strict=True)]
    return [path for path in written if path is not None]
