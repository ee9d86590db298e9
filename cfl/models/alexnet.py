"""The AlexNet-like network of the GPM/FOT Split CIFAR-100 setup (Saha et al. 2021).

conv 3->64 k4, 64->128 k3, 128->256 k2, each followed by ReLU, dropout (0.2, 0.2, 0.5) and 2x2 max-pool;
fc 1024->2048->2048 with ReLU and dropout 0.5; one Linear(2048, classes) head per task; no biases.
"""

from __future__ import annotations

import torch
from torch import nn

from cfl.heads import make_head
from cfl.models.dropout import Dropout


class AlexNetLike(nn.Module):
    def __init__(self, in_channels: int, image_size: int, classes: int, num_tasks: int, multi_head: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        size, width = image_size, in_channels
        for out, kernel, p in ((64, 4, 0.2), (128, 3, 0.2), (256, 2, 0.5)):
            layers += [nn.Conv2d(width, out, kernel, bias=False), nn.ReLU(), Dropout(p), nn.MaxPool2d(2)]
            size, width = (size - kernel + 1) // 2, out
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(width * size * size, 2048, bias=False), nn.ReLU(), Dropout(0.5),
                                        nn.Linear(2048, 2048, bias=False), nn.ReLU(), Dropout(0.5))
        self.head = make_head(2048, classes, num_tasks, multi_head, bias=False)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        return self.head(self.classifier(self.features(x)), task)

    def stack_layers(self) -> list[tuple[str, nn.Module]]:
        """The layers before ``head`` in order, with their parameter prefixes (``cfl.engine.local.stacked_net``)."""
        return [(f"{part}.{name}", m) for part in ("features", "classifier")
                for name, m in getattr(self, part).named_children()]
