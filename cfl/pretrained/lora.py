"""LoRA (Hu et al., ICLR 2022, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen linear layer
``W x + b`` plus a trainable low-rank update ``(alpha / r) B A x``, ``A`` ``(r, in)`` and ``B`` ``(out, r)``. ``A``
starts as nn.Linear's Kaiming-uniform weight and ``B`` at zero (the paper's initialisation: the adapted model starts
as the pretrained one), so the forward equals the merged weight ``W + (alpha / r) B A`` (:meth:`LoRALinear.merged`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class LoRALinear(nn.Module):
    """``base`` (its weight and bias held as buffers: frozen, shared by every client) plus the trainable factors
    ``lora_a`` and ``lora_b``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.register_buffer("weight", base.weight.detach(), persistent=False)
        self.register_buffer("bias", None if base.bias is None else base.bias.detach(), persistent=False)
        self.scale = alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(F.linear(x, self.lora_a), self.lora_b)

    def merged(self) -> torch.Tensor:
        """The one weight matrix this layer applies: ``W + (alpha / r) B A``."""
        return self.weight + self.scale * self.lora_b @ self.lora_a
