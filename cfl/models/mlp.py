"""Multi-layer perceptrons: the FOT Permuted-MNIST MLP and a small MLP for 8x8 digits."""

from __future__ import annotations

import torch
from torch import nn

from cfl.heads import make_head
from cfl.models.dropout import Dropout


class MLP(nn.Module):
    """Fully connected ReLU network; ``dropouts[i]`` follows hidden layer ``i``.

    The FOT reference MLP is ``MLP(784, [400, 400, 400], 10, dropouts=[0.2, 0.5, 0.5])``.
    """

    def __init__(
        self,
        in_features: int,
        hidden: list[int],
        classes: int,
        num_tasks: int = 1,
        multi_head: bool = False,
        dropouts: list[float] | None = None,
    ) -> None:
        super().__init__()
        dropouts = dropouts or [0.0] * len(hidden)
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size, p in zip(hidden, dropouts, strict=True):
            layers += [nn.Linear(width, size), nn.ReLU()]
            if p > 0:
                layers.append(Dropout(p))
            width = size
        self.body = nn.Sequential(*layers)
        self.head = make_head(width, classes, num_tasks, multi_head)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x), task)

    def stack_layers(self) -> list[tuple[str, nn.Module]]:
        """The layers before ``head`` in order, with their parameter prefixes (``cfl.engine.local.stacked_net``)."""
        return [(f"body.{name}", m) for name, m in self.body.named_children()]
