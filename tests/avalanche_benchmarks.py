"""Avalanche benchmarks built from in-memory tensors, for ``stream: {name: avalanche, benchmark: ...}`` configs
(importable as ``tests.avalanche_benchmarks.NAME`` with the repository root on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from cfl.data.digits import load_digits_tensors


def labelled(x: torch.Tensor, y: torch.Tensor) -> TensorDataset:
    """A TensorDataset with the ``targets`` list that ``nc_benchmark`` splits classes by."""
    data = TensorDataset(x, y)
    data.targets = y.tolist()
    return data


def digits(n_experiences: int = 5, task_labels: bool = True, **kw: Any) -> Any:
    """scikit-learn's 8x8 digits as ``nc_benchmark`` experiences of 10 / ``n_experiences`` classes each,
    in label order (``shuffle=False``)."""
    from avalanche.benchmarks.scenarios.deprecated.generators import nc_benchmark

    (xtr, ytr), (xte, yte) = load_digits_tensors()
    return nc_benchmark(labelled(xtr, ytr), labelled(xte, yte), n_experiences=n_experiences,
                        task_labels=task_labels, **{"shuffle": False, **kw})


def digits_uint8(n_experiences: int = 5, **kw: Any) -> Any:
    """:func:`digits` with 8-bit integer inputs, as raw pixels would be (refused by cfl's stream check)."""
    from avalanche.benchmarks.scenarios.deprecated.generators import nc_benchmark

    (xtr, ytr), (xte, yte) = load_digits_tensors()

    def pixels(x: torch.Tensor) -> torch.Tensor:
        return x.mul(64).add(64).clamp(0, 255).to(torch.uint8)

    return nc_benchmark(labelled(pixels(xtr), ytr), labelled(pixels(xte), yte),
                        n_experiences=n_experiences, task_labels=True, shuffle=False, **kw)


def not_a_benchmark(size: int = 3) -> list[int]:
    """A callable whose result is no benchmark (refused)."""
    return list(range(size))


def broken() -> Any:
    """A callable that fails (refused)."""
    raise FileNotFoundError("no such dataset_root: /nowhere")


NOT_CALLABLE = 42
