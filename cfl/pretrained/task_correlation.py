"""Powder's task and class correlation (Piao et al., ICML 2024; official code github.com/piaohongming/Powder at
ae7beeb, ``updateweight_with_promptchoosing`` in ``src/models_Cprompt/vit_coda_p_hard.py``), from descriptors:
a task's (or a class's) descriptor is the mean, over its training images, of the scores ``cos(q * A, K)`` of
every trained task's composed components, ``(L, T, C)``, with the set of tasks trained when it was taken.

* :func:`task_mixing`: for two tasks with descriptors, both restricted to the tasks trained in both (the code's
  "shorter list"), the cosine per prompted block averaged over the blocks, ``s``, raised to ``power`` (the code's
  ``task_index`` 30), each row divided by its sum (no softmax); rows of tasks without a descriptor stay the
  identity (the task's own components only).
* :func:`task_selection`: each task's ``top_k`` (the code's 3) largest entries of its row among the trained
  tasks (fewer where fewer are trained), as 0/1.
* :func:`class_weights`: the same similarity between classes, raised to ``power`` (``class_index`` 30), zero
  between different classes of one task, each row's ``top_k`` (3, itself included) kept and divided by their
  sum (the code's ``fc_weight``).

Computed in float64, returned in the descriptors' dtype."""

from __future__ import annotations

import torch


def similarity(desc: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """``(R, R)`` mean over blocks of the cosine between rows of ``desc`` ``(R, L, T, C)`` restricted to the tasks
    that both rows' ``trained`` ``(R, T)`` bool hold."""
    d = desc.to(torch.float64)
    common = (trained.unsqueeze(1) & trained.unsqueeze(0)).to(torch.float64)  # (R, R, T)
    dot = torch.einsum("rltc,sltc,rst->rsl", d, d, common)
    sq = (d * d).sum(-1)  # (R, L, T)
    norm_r = torch.einsum("rlt,rst->rsl", sq, common).sqrt().clamp(min=1e-12)
    norm_s = torch.einsum("slt,rst->rsl", sq, common).sqrt().clamp(min=1e-12)
    cos = dot / (norm_r * norm_s)  # (R, R, L)
    return cos.mean(-1)


def task_mixing(desc: torch.Tensor, trained: torch.Tensor, has: torch.Tensor, power: int) -> torch.Tensor:
    """``(T, T)`` row-normalised ``s ** power`` among the tasks that ``has`` ``(T,)`` a descriptor."""
    tasks = desc.shape[0]
    w = similarity(desc, trained) ** power
    inside = (has.unsqueeze(0) & has.unsqueeze(1)).to(torch.float64)
    w = w * inside
    w = w / w.sum(1, keepdim=True).clamp(min=1e-300)
    eye = torch.eye(tasks, dtype=torch.float64)
    return torch.where(has.unsqueeze(1), w, eye).to(desc.dtype)


def task_selection(mixing: torch.Tensor, has: torch.Tensor, top_k: int) -> torch.Tensor:
    """``(T, T)`` 0/1: row ``g`` marks the ``min(top_k, trained)`` largest of ``mixing[g]`` among the tasks that
    have a descriptor (ties: the lower task id); a task without one marks itself."""
    tasks = mixing.shape[0]
    k = min(top_k, int(has.sum()))
    eye = torch.eye(tasks, dtype=mixing.dtype)
    if k == 0:
        return eye
    masked = torch.where(has.unsqueeze(0), mixing.to(torch.float64), torch.tensor(float("-inf"), dtype=torch.float64))
    chosen = torch.zeros(tasks, tasks, dtype=mixing.dtype)
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices  # ties: the lower task id first
    chosen.scatter_(1, order[:, :k], 1.0)
    return torch.where(has.unsqueeze(1), chosen, eye)


def class_weights(desc: torch.Tensor, trained: torch.Tensor, has: torch.Tensor, task_of: torch.Tensor,
                  power: int, top_k: int) -> torch.Tensor:
    """``(K, K)`` Powder's class correlation of classes with descriptors ``desc`` ``(K, L, T, C)``; ``task_of``
    ``(K,)`` each class's task. Rows of classes without a descriptor are zero."""
    w = similarity(desc, trained) ** power
    same_task = task_of.unsqueeze(0) == task_of.unsqueeze(1)
    w = torch.where(same_task & ~torch.eye(len(task_of), dtype=torch.bool), torch.zeros_like(w), w)
    w = w * (has.unsqueeze(0) & has.unsqueeze(1)).to(w.dtype)
    k = min(top_k, w.shape[1])
    kept = torch.zeros_like(w).scatter_(1, w.topk(k, dim=1).indices, 1.0)
    w = w * kept
    return (w / w.sum(1, keepdim=True).clamp(min=1e-300)).to(desc.dtype)
