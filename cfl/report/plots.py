"""PNG plots of a run: the accuracy-matrix heatmap and mean accuracy over rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_matrix(results: dict[str, Any], path: Path) -> Path:
    matrix = np.array([[np.nan if v is None else v for v in row] for row in results["acc_matrix"]], dtype=float)
    n = matrix.shape[0]
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * n, 0.8 + 0.6 * n))
    im = ax.imshow(matrix, vmin=0, vmax=100, cmap="viridis")
    for i in range(n):
        for j in range(n):
            if not np.isnan(matrix[i, j]):
                ax.text(j, i, f"{matrix[i, j]:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if matrix[i, j] < 60 else "black")
    ax.set_xlabel("evaluated task")
    ax.set_ylabel("after training task")
    ax.set_xticks(range(n), [str(j + 1) for j in range(n)])
    ax.set_yticks(range(n), [str(i + 1) for i in range(n)])
    ax.set_title(f"{results['method']} on {results['stream']}: ACC {results['acc']:.1f}, FGT {results['fgt']:.1f}",
                 fontsize=9)
    fig.colorbar(im, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_curve(evaluations: list[dict[str, Any]], rounds_per_task: int, num_tasks: int, title: str,
               path: Path) -> Path:
    rounds = [e["round"] for e in evaluations]
    means = [e["mean_acc"] for e in evaluations]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(rounds, means, marker=".", lw=1.2)
    for t in range(1, num_tasks):
        ax.axvline(t * rounds_per_task, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("communication round")
    ax.set_ylabel("mean accuracy over seen tasks (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(results: dict[str, Any], evaluations: list[dict[str, Any]], rounds_per_task: int,
                out_dir: Path) -> list[Path]:
    if results["acc"] is None:
        return []
    return [
        plot_matrix(results, out_dir / "acc_matrix.png"),
        plot_curve(evaluations, rounds_per_task, results["num_tasks"],
                   f"{results['method']} on {results['stream']} ({results['partition']})",
                   out_dir / "accuracy_curve.png"),
    ]
