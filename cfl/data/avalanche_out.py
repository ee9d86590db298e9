"""cfl :class:`Stream` -> Avalanche benchmark: the centralized reference on exactly the stream cfl federates."""

from __future__ import annotations

from typing import Any

import torch

from cfl.data.stream import Stream, Task


def global_labels(stream: Stream, task: Task, y: torch.Tensor) -> torch.Tensor:
    """A task's labels as global class ids (task-incremental labels are head outputs into ``task.classes``)."""
    return torch.as_tensor(task.classes, dtype=torch.long)[y] if stream.scenario == "task" else y


def to_avalanche(stream: Stream) -> Any:
    """An Avalanche benchmark (``tensors_benchmark``) with one train and one test experience per task, in
    order, holding the task's tensors with global class ids; task labels 0..T-1 in the task scenario, 0
    otherwise. The stream's train-time augmentation, if any, is the benchmark's train transform."""
    from avalanche.benchmarks.scenarios.deprecated.generators import tensors_benchmark

    augment = stream.augment
    train_transform = None if augment is None else (lambda x: augment(x.unsqueeze(0), None)[0])
    return tensors_benchmark(
        train_tensors=[(t.train_x, global_labels(stream, t, t.train_y)) for t in stream.tasks],
        test_tensors=[(t.test_x, global_labels(stream, t, t.test_y)) for t in stream.tasks],
        task_labels=list(range(stream.num_tasks)) if stream.scenario == "task" else [0] * stream.num_tasks,
        train_transform=train_transform,
    )
