"""A prototype classifier (``model.classifier: prototype``): one learned centre ``c_k`` per class and the logits
``-d_k = -sqrt(|f - c_k|^2 / D)`` of a ``D``-wide feature ``f`` (PILoRA, Guo et al. 2024, Eq. 4-5, the
distance-based cross-entropy of Yang et al.'s convolutional prototype network; official code github.com/Ghy0501/PILoRA
``VLT.py`` ``compute_distance``: ``|f|^2 + |c|^2 - 2 f c``, over ``D``, square root). The centres start as
``0.1 N(0, 1)`` (the official ``0.1*torch.randn``). The squared distance is clamped at ``1e-12`` before the root
(the official root of a rounding-negative value is NaN; its gradient at 0 is infinite). One set of centres per task
where the scenario gives each task its own head (sample ``b`` reads its task's)."""

from __future__ import annotations

import torch
from torch import nn

#: the smallest squared distance the root sees
FLOOR = 1e-12


def prototype_distances(features: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """``(B, K)`` distances ``sqrt(|f_b - c_k|^2 / D)`` of ``features`` ``(B, D)`` to ``centers`` ``(K, D)``, in the
    official expanded form."""
    squared = (features * features).sum(1, keepdim=True) + (centers * centers).sum(1) - 2 * features @ centers.T
    return (squared / features.shape[1]).clamp(min=FLOOR).sqrt()


class PrototypeHead(nn.Module):
    """``centers`` ``(classes, D)``, or ``(tasks, classes, D)`` with one head per task; ``forward`` the logits."""

    def __init__(self, in_features: int, classes: int, num_tasks: int, multi: bool) -> None:
        super().__init__()
        shape = (num_tasks, classes, in_features) if multi else (classes, in_features)
        self.centers = nn.Parameter(0.1 * torch.randn(shape))

    def forward(self, features: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        if self.centers.dim() == 2:
            return -prototype_distances(features, self.centers)
        every = torch.stack([-prototype_distances(features, c) for c in self.centers], 1)  # (B, tasks, K)
        index = task.view(-1, 1, 1).expand(-1, 1, every.shape[-1])
        return every.gather(1, index).squeeze(1)
