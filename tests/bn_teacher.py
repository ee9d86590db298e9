"""A tiny frozen teacher with running-stat BatchNorm for the generator tests: 1x8x8 images, 3 classes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Generator training on tiny tensors runs 50x slower with several threads on a loaded 2-core machine."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


class TinyTeacher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, momentum=None)  # cumulative running statistics
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def tiny_teacher(seed: int = 0) -> TinyTeacher:
    """Running statistics from a few batches of "real" data (pixels ~ N(0.3, 0.5^2)), then eval mode."""
    torch.manual_seed(seed)
    model = TinyTeacher()
    with torch.no_grad():
        for _ in range(4):
            model(0.3 + 0.5 * torch.randn(32, 1, 8, 8))
    return model.eval()
