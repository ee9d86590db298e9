"""Output heads: one shared head, or one head per task selected by each sample's task id."""

from __future__ import annotations

import torch
from torch import nn


class SharedHead(nn.Linear):
    """One linear head for every task (domain- and class-incremental scenarios)."""

    def forward(self, features: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return super().forward(features)


class MultiHead(nn.Module):
    """One linear head per task (task-incremental); sample ``b`` uses head ``task[b]``.

    The weights are one tensor ``(num_tasks, classes, features)`` so that a batch mixing tasks (replay)
    and a stack of clients (the batched engine) both stay single tensor operations.
    """

    def __init__(self, in_features: int, classes: int, num_tasks: int, bias: bool = True) -> None:
        super().__init__()
        layer = nn.Linear(in_features, classes * num_tasks, bias=bias)
        self.weight = nn.Parameter(layer.weight.detach().view(num_tasks, classes, in_features).clone())
        self.bias = nn.Parameter(layer.bias.detach().view(num_tasks, classes).clone()) if bias else None

    def forward(self, features: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        # every head's logits, then each sample's own: a gather (not an indexed weight) keeps the
        # backward a per-sample scatter, which vmap batches per client.
        logits = torch.einsum("bf,tcf->btc", features, self.weight)
        if self.bias is not None:
            logits = logits + self.bias
        index = task.view(-1, 1, 1).expand(-1, 1, logits.shape[-1])
        return logits.gather(1, index).squeeze(1)


def make_head(in_features: int, classes: int, num_tasks: int, multi: bool, bias: bool = True) -> nn.Module:
    if multi:
        return MultiHead(in_features, classes, num_tasks, bias=bias)
    return SharedHead(in_features, classes, bias=bias)
