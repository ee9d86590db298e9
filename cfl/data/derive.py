"""Derive continual streams from one labelled dataset: pixel permutations or class splits."""

from __future__ import annotations

import numpy as np
import torch

from cfl.config.schema import ConfigError
from cfl.data.stream import Task


def permuted_tasks(
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    num_tasks: int,
    seed: int,
    prefix: str = "perm",
    permutations: list[torch.Tensor] | None = None,
) -> list[Task]:
    """Permuted-MNIST recipe: one fixed random pixel permutation per task (task 0 permuted too).

    The permutations are drawn with a torch generator seeded by ``seed`` unless given explicitly.
    """
    (train_x, train_y), (test_x, test_y) = train, test
    flat_train, flat_test = train_x.flatten(1), test_x.flatten(1)
    dim = flat_train.shape[1]
    gen = torch.Generator().manual_seed(seed)
    classes = sorted(int(c) for c in torch.unique(train_y))
    tasks = []
    for t in range(num_tasks):
        perm = torch.randperm(dim, generator=gen) if permutations is None else permutations[t]
        tasks.append(Task(f"{prefix}-{t}", flat_train.index_select(1, perm), train_y.clone(),  # faster than [:, perm]
                          flat_test.index_select(1, perm), test_y.clone(), classes))
    return tasks


def split_tasks(
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    classes_per_task: int,
    num_tasks: int,
    global_labels: bool,
    prefix: str = "split",
    source: str = "the data files",
) -> list[Task]:
    """Split recipe: classes in label order, ``classes_per_task`` per task.

    Labels are remapped to 0..classes_per_task-1 within each task (task-incremental) unless
    ``global_labels`` (class-incremental, one head over every class).
    """
    (train_x, train_y), (test_x, test_y) = train, test
    tasks = []
    for t in range(num_tasks):
        classes = list(range(t * classes_per_task, (t + 1) * classes_per_task))
        size = max(int(train_y.max()), int(test_y.max()), classes[-1]) + 1
        lookup = torch.full((size,), -1, dtype=torch.long)
        for i, c in enumerate(classes):
            lookup[c] = c if global_labels else i
        tr, te = lookup[train_y] >= 0, lookup[test_y] >= 0
        if not tr.any() or not te.any():
            raise ConfigError(f"{prefix}: task {t} (classes {classes[0]}..{classes[-1]}) has {int(tr.sum())} "
                              f"training and {int(te.sum())} test samples: {source} lack these classes. "
                              f"Lower stream.num_tasks or use complete data files (see docs/data.md)")
        tasks.append(Task(f"{prefix}-{t}", train_x[tr].contiguous(), lookup[train_y[tr]],
                          test_x[te].contiguous(), lookup[test_y[te]], classes))
    return tasks


def avalanche_permutations(seed: int, num_tasks: int, dim: int) -> list[torch.Tensor]:
    """The pixel permutations of Avalanche's ``PermutedMNIST(seed=seed)``: successive draws of
    ``np.random.RandomState(seed).permutation(dim)``, one per experience."""
    rng = np.random.RandomState(seed)
    return [torch.from_numpy(rng.permutation(dim)).long() for _ in range(num_tasks)]
