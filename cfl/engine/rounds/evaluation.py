"""The round loop's evaluations (cfl/engine/rounds/runner.py ``Runner.run``): the global model (or, with parameters kept
per client, the mean over the clients of each one's own model) on every task some client has started by the round
(class-incremental: masked to the classes of those tasks); under the synchronous plan these are tasks 0..t of the
current task t. The record is kept in ``progress.evaluations``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cfl.engine.rounds.run_state import RunState
from cfl.metrics import client_forgetting
from cfl.metrics.evaluate import accuracy, class_counts, per_class_percent


def accuracies(run: RunState, tasks: list[int], mask: torch.Tensor | None) -> list[float]:
    """Each of ``tasks``' test accuracy, the loss masked to ``mask`` (None: the whole head)."""
    data = run.stream.tasks
    per_model = [[accuracy(run.model, params, data[j].test_x, data[j].test_y, j, mask) for j in tasks]
                 for params in run.evaluated()]
    return per_model[0] if len(per_model) == 1 else [float(np.mean(col)) for col in zip(*per_model, strict=True)]


def evaluate(run: RunState, rnd: int, switched: list[tuple[int, int]], final: bool) -> dict[str, Any]:
    """The evaluation after global round ``rnd`` (``switched``: the (client, task) pairs switching after it, said
    in the record under a plan other than the synchronous one)."""
    tasks = run.schedule.started(rnd)
    accs = accuracies(run, tasks, run.schedule.class_mask(tasks))
    prog = run.progress
    record: dict[str, Any] = {"task": max(tasks), "round": prog.global_round, "final": final,
                              "acc": {str(j): a for j, a in zip(tasks, accs, strict=True)},
                              "mean_acc": float(np.mean(accs))}
    if not run.plan.synchronous:
        record["switched"] = [[c, t] for c, t in switched]
    record.update(upload_bytes=run.comm.upload_bytes, download_bytes=run.comm.download_bytes)
    pending = client_forgetting.since_last_evaluation(prog.client_forgetting, prog.evaluations)
    if pending:
        record["client_forgetting"] = pending
    prog.evaluations.append(record)
    return record


def accuracy_of(run: RunState, task: int) -> float:
    """The global model's accuracy on ``task`` with the task's head and no class mask (forward transfer)."""
    t = run.stream.tasks[task]
    return float(np.mean([accuracy(run.model, params, t.test_x, t.test_y, task) for params in run.evaluated()]))


def class_accuracy(run: RunState, upto: int) -> dict[str, float]:
    """Per class (class-incremental): the accuracy over the test sets of tasks 0..upto, seen classes only."""
    mask = run.schedule.class_mask(list(range(upto + 1)))
    counts = [class_counts(run.model, params, t.test_x, t.test_y, j, run.stream.classes_per_head, mask)
              for params in run.evaluated() for j, t in enumerate(run.stream.tasks[: upto + 1])]
    return per_class_percent(torch.stack([c for c, _ in counts]).sum(0), torch.stack([n for _, n in counts]).sum(0))
