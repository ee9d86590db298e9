"""A seeded, class-balanced subset of each task's samples (``stream.train_per_class`` / ``test_per_class``): the
same number of samples of every class of a task, for quick runs of any stream (e.g. a 224 px backbone on
Fashion-MNIST, whose 70,000 images would take hours through it on a CPU).

The subset is drawn per task, split and class with numpy's generator seeded by ``(seed, task, split)`` (the
stream seed: ``stream.seed``, else the run seed) and keeps the samples' original order. A count above a class's
samples is refused (the subset could not be balanced), and so is a count that keeps every sample (the key would
change nothing).
"""

from __future__ import annotations

import numpy as np
import torch

from cfl.config.schema import ConfigError
from cfl.data.stream import Stream

SPLITS = ("train", "test")


def balanced_indices(y: torch.Tensor, per_class: int, rng: np.random.Generator) -> torch.Tensor:
    """Sorted indices of ``per_class`` samples of each label of ``y``, drawn without replacement."""
    labels = y.cpu().numpy()
    chosen = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return torch.from_numpy(np.sort(np.concatenate(chosen)))


def _problem(stream: Stream, split: str, per_class: int) -> str | None:
    """Why ``per_class`` cannot subset ``split`` of ``stream`` (None: it can)."""
    counts = [(task.name, *torch.unique(getattr(task, f"{split}_y").cpu(), return_counts=True))
              for task in stream.tasks]
    counts = [(name, labels, n) for name, labels, n in counts if len(n)]
    if not counts:
        return f"no task has {split} samples"
    fewest = min(int(n.min()) for _, _, n in counts)
    for name, labels, n in counts:
        if int(n.min()) < per_class:
            at = int(n.argmin())
            return (f"task '{name}' has only {int(n[at])} {split} samples of class {int(labels[at])}, fewer than "
                    f"{per_class}: the subset could not be class-balanced; give at most {fewest}")
    largest = max(int(n.max()) for _, _, n in counts)
    if largest <= per_class:
        return (f"no class of any task has more than {largest} {split} samples, so {per_class} per class keeps "
                f"them all; remove the key (null)")
    return None


def subset_per_class(stream: Stream, train_per_class: int | None, test_per_class: int | None, seed: int) -> None:
    """Cut every task of ``stream`` (in place) to ``train_per_class`` training and ``test_per_class`` test samples
    of each class (None: all of that split); ConfigError where a count cannot be met or keeps everything."""
    counts = {"train": train_per_class, "test": test_per_class}
    for split, per_class in counts.items():
        problem = None if per_class is None else _problem(stream, split, per_class)
        if problem:
            raise ConfigError(f"stream.{split}_per_class {per_class} on stream '{stream.name}': {problem}")
    for t, task in enumerate(stream.tasks):
        for s, split in enumerate(SPLITS):
            if counts[split] is None:
                continue
            x, y = getattr(task, f"{split}_x"), getattr(task, f"{split}_y")
            keep = balanced_indices(y, counts[split], np.random.default_rng([seed, t, s])).to(y.device)
            setattr(task, f"{split}_x", x[keep])
            setattr(task, f"{split}_y", y[keep])
