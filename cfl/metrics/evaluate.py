"""Evaluation of a model on a task's full test set with the task's own head, ``EVAL_CHUNK`` samples at a time."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from cfl.tensors import Params

EVAL_CHUNK = 2048


@torch.no_grad()
def hits(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int,
         allowed: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) bool: whether the argmax of each sample's logits is its label, in eval mode (dropout off).

    ``allowed`` (K,) restricts the argmax to the classes seen so far (class-incremental).
    """
    model.eval()
    out = torch.empty(len(y), dtype=torch.bool, device=y.device)
    for start in range(0, len(y), EVAL_CHUNK):
        xb, yb = x[start : start + EVAL_CHUNK], y[start : start + EVAL_CHUNK]
        logits = functional_call(model, params, (xb, torch.full_like(yb, task)))
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        out[start : start + EVAL_CHUNK] = logits.argmax(1) == yb
    return out


def accuracy(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int,
             allowed: torch.Tensor | None = None) -> float:
    """Accuracy in percent over the test set (0 for an empty one); ``allowed`` as in :func:`hits`."""
    return 100.0 * int(hits(model, params, x, y, task, allowed).sum()) / max(len(y), 1)


def class_counts(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int, num_classes: int,
                 allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(K,) correct answers and (K,) test samples per class (float64); ``allowed`` as in :func:`hits`."""
    correct = torch.zeros(num_classes, dtype=torch.float64, device=y.device)
    correct.index_add_(0, y, hits(model, params, x, y, task, allowed).to(torch.float64))
    return correct, torch.bincount(y, minlength=num_classes).to(torch.float64)


def per_class_percent(correct: torch.Tensor, count: torch.Tensor) -> dict[str, float]:
    """``{str(class): accuracy %}`` over the classes that have test samples."""
    return {str(c): 100.0 * float(correct[c]) / float(count[c]) for c in count.nonzero().flatten().tolist()}
