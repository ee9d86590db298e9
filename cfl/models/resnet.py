"""Reduced ResNet-18 of the GPM/FOT setups (Lopez-Paz & Ranzato 2017; Saha et al. 2021).

Blocks [2, 2, 2, 2] of two 3x3 convs, 1x1 conv shortcuts where the shape changes, widths nf, 2nf, 4nf,
8nf, bias-free convs, a 3x3 stem (stride 1 for 32x32 inputs, 2 for 84x84), 2x2 average pool, flatten,
bias-free heads. ``batch_norm``: ``none`` (no normalisation), ``batch`` (BatchNorm with batch statistics only,
``track_running_stats=False``: it behaves the same in training and evaluation and keeps no buffers) or ``running``
(PyTorch's default BatchNorm: batch statistics in training, which update the running mean and variance buffers;
those in evaluation; the engine carries the buffers with the global model, ``model.buffers`` in the config,
docs/concepts.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cfl.heads import make_head

#: ``batch_norm`` values: none, batch statistics only, or running statistics
BATCH_NORMS = ("none", "batch", "running")


def _norm(width: int, batch_norm: str) -> nn.Module:
    if batch_norm not in BATCH_NORMS:
        raise ValueError(f"batch_norm must be one of {BATCH_NORMS}, not {batch_norm!r}")
    if batch_norm == "none":
        return nn.Identity()
    return nn.BatchNorm2d(width, track_running_stats=batch_norm == "running")


class BasicBlock(nn.Module):
    def __init__(self, width_in: int, width: int, stride: int, batch_norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width_in, width, 3, stride, 1, bias=False)
        self.bn1 = _norm(width, batch_norm)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = _norm(width, batch_norm)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or width_in != width:
            self.shortcut = nn.Sequential(nn.Conv2d(width_in, width, 1, stride, bias=False), _norm(width, batch_norm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ReducedResNet18(nn.Module):
    """``features`` = 8nf channels x (spatial size after the 2x2 average pool)^2: 640 for nf=20 on 32x32
    with a stride-1 stem, 2304 for nf=32 on 84x84 with a stride-2 stem."""

    def __init__(self, in_channels: int, image_size: int, classes: int, num_tasks: int, multi_head: bool,
                 nf: int, stem_stride: int, batch_norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, nf, 3, stem_stride, 1, bias=False)
        self.bn1 = _norm(nf, batch_norm)
        blocks: list[nn.Module] = []
        width, size = nf, (image_size - 1) // stem_stride + 1
        for stage, stride in enumerate((1, 2, 2, 2)):
            out = nf * 2**stage
            blocks += [BasicBlock(width, out, stride, batch_norm), BasicBlock(out, out, 1, batch_norm)]
            width, size = out, (size - 1) // stride + 1
        self.blocks = nn.Sequential(*blocks)
        self.features = width * (size // 2) ** 2
        self.head = make_head(self.features, classes, num_tasks, multi_head, bias=False)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        out = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.head(F.avg_pool2d(out, 2).flatten(1), task)
