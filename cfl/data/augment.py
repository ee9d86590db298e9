"""Train-time augmentation on tensor batches: random crop with zero-image padding, horizontal flip.

Mini-ImageNet's reference recipe (torchvision ``RandomCrop(84, padding=4)`` + ``RandomHorizontalFlip``),
done on normalised ``(N, C, H, W)`` tensors inside training so the data stays tensors, never PIL images.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class CropFlip:
    """``augment(x, generator)``: pad by ``pad`` with the normalised value of a black pixel, crop back
    to ``H x W`` at a random offset per image, then mirror each image left-right with probability 1/2."""

    def __init__(self, pad: int, black: torch.Tensor) -> None:
        self.pad = pad
        self.black = black.detach().clone().view(1, -1, 1, 1)  # per channel: (0 - mean) / std

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        n, _, h, w = x.shape
        p = self.pad
        black = self.black.to(device=x.device, dtype=x.dtype)
        padded = F.pad(x - black, (p, p, p, p)) + black
        dy = torch.randint(0, 2 * p + 1, (n, 1), generator=generator, device=generator.device if generator else None)
        dx = torch.randint(0, 2 * p + 1, (n, 1), generator=generator, device=generator.device if generator else None)
        dy, dx = dy.to(x.device), dx.to(x.device)
        rows = (torch.arange(h, device=x.device) + dy)[:, None, :, None].expand(-1, x.shape[1], -1, w + 2 * p)
        out = padded.gather(2, rows)
        cols = (torch.arange(w, device=x.device) + dx)[:, None, None, :].expand(-1, x.shape[1], h, -1)
        out = out.gather(3, cols)
        flip = torch.rand(n, generator=generator, device=generator.device if generator else None) < 0.5
        return torch.where(flip.to(x.device).view(n, 1, 1, 1), out.flip(-1), out)
