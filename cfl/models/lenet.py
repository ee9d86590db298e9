"""The small sigmoid LeNet of the gradient-leakage papers (Zhu et al., "Deep Leakage from Gradients", 2019; iDLG),
which GLFC's clients use as a fixed encoder: they upload its gradient, the proxy server inverts it.

Three 5x5 convolutions 12 channels wide (padding 2, strides 2, 2, 1), each followed by a sigmoid, then one linear
layer to the classes; every weight and bias ~ U(-0.5, 0.5) (the official GLFC code, ``src/myNetwork.py``: a
3x32x32 input gives the code's 768 features). Never trained. A flat input whose size is a square (e.g. 784) is
read as a one-channel square image (our reading for MNIST-like streams stored flat).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(C, H, W)`` of a stream's inputs: a square image as it is, a flat square size as one channel."""
    if len(input_shape) == 3 and input_shape[1] == input_shape[2]:
        return input_shape[0], input_shape[1], input_shape[2]
    if len(input_shape) == 1 and math.isqrt(input_shape[0]) ** 2 == input_shape[0]:
        side = math.isqrt(input_shape[0])
        return 1, side, side
    raise ValueError(f"the gradient LeNet needs square (C, H, W) images or a flat square size (e.g. 784); the "
                     f"stream gives {input_shape}")


class GradientLeNet(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        channels, side, _ = image_shape(self.input_shape)
        layers: list[nn.Module] = []
        for stride in (2, 2, 1):
            layers += [nn.Conv2d(channels, 12, kernel_size=5, padding=2, stride=stride), nn.Sigmoid()]
            channels, side = 12, (side - 1) // stride + 1
        self.body = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Linear(12 * side * side, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x.reshape(len(x), *image_shape(self.input_shape))))


def uniform_init_(model: nn.Module, generator: torch.Generator, bound: float = 0.5) -> nn.Module:
    """Every parameter ~ U(-bound, bound), drawn from ``generator`` in parameter order (the same seed: the same net)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=generator, dtype=p.dtype) * 2 * bound - bound)
    return model
