"""Test accuracy of the global model on one task's full test set, with the task's own head."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from cfl.methods.base import Params

EVAL_CHUNK = 2048


@torch.no_grad()
def accuracy(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int,
             allowed: torch.Tensor | None = None) -> float:
    """Accuracy in percent; ``allowed`` restricts the argmax to seen classes (class-incremental)."""
    model.eval()
    correct = 0
    for start in range(0, len(y), EVAL_CHUNK):
        xb, yb = x[start : start + EVAL_CHUNK], y[start : start + EVAL_CHUNK]
        logits = functional_call(model, params, (xb, torch.full_like(yb, task)))
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        correct += int((logits.argmax(1) == yb).sum())
    return 100.0 * correct / max(len(y), 1)
