"""In-memory task streams: every experience turned into tensors once, then reused every round."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

SCENARIOS = ("domain", "task", "class")


@dataclass
class Task:
    """One experience: normalised inputs and labels (labels local to the task's head)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list[int]  # global class ids, in head order (label i of this task is classes[i])


@dataclass
class Stream:
    """A sequence of tasks plus how they are scored.

    ``scenario``: ``domain`` (one shared head, labels 0..K-1 reused), ``task`` (one head per task,
    labels 0..K-1 per task), ``class`` (one head over all classes, labels are global class ids).
    """

    name: str
    scenario: str
    tasks: list[Task]
    classes_per_head: int
    input_shape: tuple[int, ...]
    default_model: str
    info: dict = field(default_factory=dict)
    # optional train-time augmentation of a (N, *input_shape) batch: augment(x, generator) -> x
    augment: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {SCENARIOS}, got {self.scenario!r}")

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    def class_mask(self, upto_task: int) -> torch.Tensor | None:
        """Class-incremental: the head's classes seen in tasks 0..upto_task; None otherwise."""
        if self.scenario != "class":
            return None
        mask = torch.zeros(self.classes_per_head, dtype=torch.bool)
        for task in self.tasks[: upto_task + 1]:
            mask[task.classes] = True
        return mask

    def seen_classes(self, upto_task: int) -> torch.Tensor:
        """The global class ids of tasks 0..upto_task, sorted (class-incremental: the head's columns)."""
        return torch.tensor(sorted({c for task in self.tasks[: upto_task + 1] for c in task.classes}), dtype=torch.long)


def prefix(stream: Stream, num_tasks: int) -> Stream:
    """The first ``num_tasks`` tasks of ``stream`` as a new Stream (new Task objects: moving them to a
    device leaves the caller's stream as it was; no cached fingerprint)."""
    tasks = [dataclasses.replace(task) for task in stream.tasks[:num_tasks]]
    info = {k: v for k, v in stream.info.items() if k != "fingerprint"}
    return dataclasses.replace(stream, tasks=tasks, info=info)
