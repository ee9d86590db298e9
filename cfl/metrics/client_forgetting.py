"""Local client forgetting within a round (TCE paper, Sec. 3, "Local client forgetting"; Fig. 2).

``F_ki = Acc_k(w_t^i) - Acc_k(w_{t-1})``: the accuracy on client k's local test data of client i's model
after its local training in round t (before aggregation), minus that of the global model the round
started from; ``F_k = mean_{i != k} F_ki`` is how much the other clients' local training forgot client
k's data. Negative values are accuracy lost (the paper's heat maps show the same differences).

Our clients have no test split of their own, so ``Acc_k`` is the accuracy on the task's test set
re-weighted to client k's label distribution (its training labels of the current task):
``Acc_k(w) = sum_c p_k(c) acc_c(w)`` with ``acc_c`` the per-class test accuracy. It is measured on the
first ``client_forgetting_clients`` clients of the round (clients are sampled at random and sorted by id),
at one test-set evaluation per measured client plus one for the global model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from cfl.data.stream import Stream
from cfl.metrics.evaluate import class_counts


class SampledClient(Protocol):
    """What the metric reads of a sampled client (the engine's ``ClientJob``): its id and its training rows."""

    cid: int
    indices: torch.Tensor  # (n_c,) long: rows of the task's training tensors


def class_accuracy(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                   task: int, num_classes: int, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """(K,) test accuracy (%) per class; NaN for classes without test samples."""
    correct, count = class_counts(model, params, x, y, task, num_classes, allowed)
    return torch.where(count > 0, 100.0 * correct / count.clamp(min=1), torch.full_like(count, float("nan")))


def label_distribution(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(K,) share of each class among a client's labels."""
    count = torch.bincount(y, minlength=num_classes).to(torch.float64)
    return count / count.sum().clamp(min=1)


def local_accuracy(class_acc: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """``Acc_k`` for every client k (rows of ``dist``) and model (rows of ``class_acc``): (M_models, M_clients).

    Classes without test samples are left out and the client's shares renormalised over the rest.
    """
    has_test = ~torch.isnan(class_acc[0])
    share = dist[:, has_test] / dist[:, has_test].sum(1, keepdim=True).clamp(min=1e-12)
    return class_acc[:, has_test] @ share.T


def forgetting_matrix(global_acc: torch.Tensor, client_acc: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """``F[k, i] = Acc_k(w_i) - Acc_k(w_global)`` from per-class accuracies (K,), (M, K) and shares (M, K)."""
    before = local_accuracy(global_acc.unsqueeze(0), dist)[0]  # (M,) over clients k
    after = local_accuracy(client_acc, dist)  # (M models i, M clients k)
    return after.T - before.unsqueeze(1)


def mean_over_others(matrix: torch.Tensor) -> torch.Tensor:
    """``F_k = mean_{i != k} F[k, i]`` (the diagonal, a client's own model on its own data, left out)."""
    m = matrix.shape[0]
    off_diagonal = ~torch.eye(m, dtype=torch.bool, device=matrix.device)
    return (matrix * off_diagonal).sum(1) / max(m - 1, 1)


def measure(model: nn.Module, global_params: dict[str, torch.Tensor], stream: Stream, task: int,
            round_number: int, clients: int, jobs: Sequence[SampledClient], trained: dict[str, torch.Tensor],
            keep: torch.Tensor) -> dict[str, Any] | None:
    """The round's entry (clients, ``F_ki``, ``F_k``, their mean) or None when the metric is off.

    Call before the global model is replaced: ``global_params`` is ``w_{t-1}``; ``trained`` holds the
    clients' models stacked over all jobs of the round and ``keep`` marks the rows of ``jobs``; the first
    ``clients`` (``client_forgetting_clients``) of ``jobs`` are measured; ``round_number`` is 1-based.
    """
    n = min(clients, len(jobs))
    if n < 2:
        return None
    data = stream.tasks[task]
    allowed = stream.class_mask(task)
    allowed = None if allowed is None else allowed.to(data.test_y.device)
    K = stream.classes_per_head
    rows = keep.nonzero().flatten().tolist()[:n]

    def per_class(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return class_accuracy(model, params, data.test_x, data.test_y, task, K, allowed)

    global_acc = per_class(global_params)
    client_acc = torch.stack([per_class({k: v[row] for k, v in trained.items()}) for row in rows])
    dist = torch.stack([label_distribution(data.train_y[job.indices], K) for job in jobs[:n]])
    matrix = forgetting_matrix(global_acc, client_acc, dist)
    per_client = mean_over_others(matrix)
    return {"task": task, "round": round_number, "clients": [job.cid for job in jobs[:n]],
            "F_ki": matrix.tolist(), "F_k": per_client.tolist(), "mean": float(per_client.mean())}


def since_last_evaluation(entries: list[dict[str, Any]], evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries measured after the previous evaluation record (to attach to the next one)."""
    last = evaluations[-1]["round"] if evaluations else 0
    return [e for e in entries if e["round"] > last]


def summarise(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``results.json`` figures: mean ``F_k`` over all measured rounds, per task, and of the last round."""
    if not entries:
        return {"rounds_measured": 0, "mean_F": None, "per_task": {}, "last_round_mean_F": None}
    tasks = sorted({e["task"] for e in entries})
    return {"rounds_measured": len(entries), "mean_F": float(np.mean([e["mean"] for e in entries])),
            "per_task": {str(t): float(np.mean([e["mean"] for e in entries if e["task"] == t])) for t in tasks},
            "last_round_mean_F": entries[-1]["mean"]}
