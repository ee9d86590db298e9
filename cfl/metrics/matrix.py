"""Continual-learning metrics over an accuracy matrix (Lopez-Paz & Ranzato 2017; FOT poster).

``a[i][j]`` is the test accuracy (%) on task j after training task i (``None`` for j > i).
"""

from __future__ import annotations

from typing import Optional

from cfl.records.snapshot import Matrix


def empty_matrix(num_tasks: int) -> Matrix:
    return [[None] * num_tasks for _ in range(num_tasks)]


def average_accuracy(a: Matrix, after: int | None = None) -> float:
    """ACC = mean_j a[T][j] over the tasks seen after task ``after`` (default: the last row)."""
    t = len(a) - 1 if after is None else after
    return sum(a[t][j] for j in range(t + 1)) / (t + 1)


def forgetting(a: Matrix, after: int | None = None) -> float:
    """FGT = mean_{j<T} (a[j][j] - a[T][j]) (FOT's definition; 0 with a single task)."""
    t = len(a) - 1 if after is None else after
    if t == 0:
        return 0.0
    return sum(a[j][j] - a[t][j] for j in range(t)) / t


def backward_transfer(a: Matrix, after: int | None = None) -> float:
    """BWT = mean_{j<T} (a[T][j] - a[j][j]) = -FGT."""
    return -forgetting(a, after)


def rounds_to_targets(curve: list[tuple[int, float]], targets: list[float]) -> dict[str, Optional[int]]:
    """First round at which the accuracy curve reaches each target (None: never reached)."""
    out: dict[str, Optional[int]] = {}
    for target in targets:
        out[f"{target:g}"] = next((r for r, acc in curve if acc >= target), None)
    return out
