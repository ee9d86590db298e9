"""The image generators of the data-free class-incremental methods, trained on the server only (not in the model
registry, whose models the clients train).

Both map a noise vector to an image through a linear layer onto a ``(width, S/4, S/4)`` map, BatchNorm, and two
nearest 2x upsamplings with 3x3 convolutions, BatchNorm and LeakyReLU(0.2); the image side ``S`` must be a
multiple of 4 (28 and 32 are).

- :class:`TargetGenerator` (TARGET, Zhang et al., ICCV 2023; official ``methods/target.py``): widths 2 ngf, 2 ngf,
  ngf, bias-free inner convs, a sigmoid: images in ``[0, 1]``, normalised with the data's mean/std before the
  teacher sees them.
- :class:`MfclGenerator` (MFCL, Babakniya et al., NeurIPS 2023; official ``models/generator.py``, after Fang et
  al.'s DFAD generator): widths ``width``, ``width``, ``hidden``; tanh, then a BatchNorm without affine
  parameters, so its images come out standardised per channel. ``eps_quirk``: the official inner BatchNorms pass
  0.8 as their second argument, which PyTorch reads as ``eps`` (DCGAN code meant it as the momentum); on by
  default, as in the code that produced the paper's numbers.
"""

from __future__ import annotations

import torch
from torch import nn


def _start_size(image_size: int) -> int:
    if image_size % 4 or image_size < 4:
        raise ValueError(f"the generator upsamples twice by 2: the image side must be a multiple of 4, got "
                         f"{image_size}")
    return image_size // 4


class TargetGenerator(nn.Module):
    """TARGET's generator: ``z (B, nz)`` -> images ``(B, channels, S, S)`` in ``[0, 1]``."""

    def __init__(self, nz: int = 256, ngf: int = 64, image_size: int = 32, channels: int = 3) -> None:
        super().__init__()
        self.nz, self.start = nz, _start_size(image_size)
        self.project = nn.Linear(nz, 2 * ngf * self.start**2)
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * ngf),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * ngf),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, channels, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.body(self.project(z).view(z.shape[0], -1, self.start, self.start))


class MfclGenerator(nn.Module):
    """MFCL's generator: ``z (B, nz)`` -> standardised images ``(B, channels, S, S)``."""

    def __init__(self, nz: int = 1000, width: int = 128, hidden: int = 64, image_size: int = 32,
                 channels: int = 3, eps_quirk: bool = True) -> None:
        super().__init__()
        self.nz, self.start, self.width = nz, _start_size(image_size), width
        eps = 0.8 if eps_quirk else 1e-5
        self.project = nn.Linear(nz, width * self.start**2)
        self.norm0 = nn.BatchNorm2d(width)
        self.block1 = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width, eps=eps),
                                    nn.LeakyReLU(0.2))
        self.block2 = nn.Sequential(nn.Conv2d(width, hidden, 3, padding=1), nn.BatchNorm2d(hidden, eps=eps),
                                    nn.LeakyReLU(0.2), nn.Conv2d(hidden, channels, 3, padding=1), nn.Tanh(),
                                    nn.BatchNorm2d(channels, affine=False))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.norm0(self.project(z).view(z.shape[0], self.width, self.start, self.start))
        out = self.block1(nn.functional.interpolate(out, scale_factor=2))
        return self.block2(nn.functional.interpolate(out, scale_factor=2))

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` images from fresh noise ``z ~ N(0, I)`` drawn from ``generator`` (in the module's mode)."""
        device = self.project.weight.device
        z = torch.randn(n, self.nz, generator=generator, device=generator.device if generator else device)
        return self(z.to(device))
