"""The trainable part of a run on a frozen backbone's cached features: one linear head (shared, or one per task)
on ``(N, D)`` feature vectors (linear probing; the classifier that fedncm and afcl set in closed form)."""

from __future__ import annotations

import torch
from torch import nn

from cfl.heads import make_head


class FeatureHead(nn.Module):
    """``head(features, task)``: the model the engine trains when the backbone's features are cached."""

    def __init__(self, features: int, classes: int, num_tasks: int, multi_head: bool) -> None:
        super().__init__()
        self.features = features
        self.head = make_head(features, classes, num_tasks, multi_head)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        return self.head(x, task)
