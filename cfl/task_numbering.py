"""How a task is named wherever a user reads it: by its index from 0, as in ``results.json``, ``metrics.jsonl``,
W&B and the figures (docs/concepts.md, "Task numbering")."""

from __future__ import annotations


def task_name(task: int, num_tasks: int | None = None) -> str:
    """``task 2 (0-based)``, or with the stream's length ``task 2 of 0-4`` (the third of five tasks)."""
    if num_tasks is None:
        return f"task {task} (0-based)"
    return f"task {task} of 0-{num_tasks - 1}"
