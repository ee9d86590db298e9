"""Client losses, written over any leading dims so one code path serves one client or a stack."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cfl.registry import Registry

#: ``loss`` names: what the client's softmax runs over (the runner's ``allowed_classes`` reads the name)
LOSSES: Registry[None] = Registry("loss")
LOSSES.register("ce", None, about="cross-entropy over the head's classes (class-incremental: the classes seen so far)")
LOSSES.register("tce", None, about="truncated cross-entropy (the TCE paper, eq. 3): softmax only over the labels in "
                "the client's data")


def masked_cross_entropy(logits: torch.Tensor, y: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Per-sample cross-entropy whose softmax runs only over ``allowed`` classes.

    ``logits`` (..., B, K), ``y`` (..., B), ``allowed`` (..., K) bool or None (every class).
    With ``allowed`` = the labels in a client's data this is TCE (Truncated Cross-Entropy, the TCE
    paper, eq. 3); with every class allowed it is plain cross-entropy.
    """
    if allowed is not None:
        logits = logits.masked_fill(~allowed.unsqueeze(-2), float("-inf"))
    logp = F.log_softmax(logits, dim=-1)
    return -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)


def weighted_mean(per_sample: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over the last dim counting only weighted samples; 0 where a row has no samples."""
    per_sample = torch.where(weight > 0, per_sample, torch.zeros_like(per_sample))
    return (per_sample * weight).sum(-1) / weight.sum(-1).clamp(min=1e-12)
