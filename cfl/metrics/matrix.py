"""Continual-learning metrics over an accuracy matrix (Lopez-Paz & Ranzato 2017; FOT poster; Rebuffi et al. 2017).

``a[i][j]`` is the test accuracy (%) on task j after training task i (``None`` for j > i). Forward transfer
also needs ``before[i]``, the accuracy on task i of the model just before training task i (``a[i-1][i]`` in
GEM's notation, which our matrix leaves out), and ``init[i]``, that of the randomly initialised model (GEM's
``b_i``).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def average_incremental_accuracy(a: Matrix, after: int | None = None) -> float:
    """AIA = mean_{i<=T} ACC_i, with ACC_i = mean_{j<=i} a[i][j] the mean accuracy over the tasks seen after task
    i (iCaRL's average incremental accuracy, Rebuffi et al. 2017, over task ends)."""
    t = len(a) - 1 if after is None else after
    return sum(average_accuracy(a, i) for i in range(t + 1)) / (t + 1)


def forward_transfer(before: Sequence[float | None], init: Sequence[float | None], after: int) -> float | None:
    """FWT = mean_{1<=i<=T} (before[i] - init[i]) (GEM's FWT, Lopez-Paz & Ranzato 2017: mean of ``R[i-1][i] - b_i``,
    the reference ``b_i`` being the randomly initialised model's accuracy on task i). None after the first task
    (no task had a predecessor) or when a term was not measured."""
    if after < 1 or len(before) <= after or len(init) <= after:
        return None
    diffs = [b - r for b, r in zip(before[1 : after + 1], init[1 : after + 1], strict=True)
             if b is not None and r is not None]
    return sum(diffs) / after if len(diffs) == after else None


def rounds_to_targets(curve: list[tuple[int, float]], targets: list[float]) -> dict[str, Optional[int]]:
    """First round at which the accuracy curve reaches each target (None: never reached)."""
    out: dict[str, Optional[int]] = {}
    for target in targets:
        out[f"{target:g}"] = next((r for r, acc in curve if acc >= target), None)
    return out
