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


#: ``method.class_mask`` of the pretrained methods: ``current`` (the softmax over the sample's own task's classes,
#: the official L2P, CODA-P, Fed-CPrompt and LoRM code) or ``seen`` (every class seen so far, cfl's ``loss: ce``)
CLASS_MASKS = ("current", "seen")


def task_class_table(task_classes: tuple[tuple[int, ...], ...], num_classes: int) -> torch.Tensor:
    """``(T, K)`` bool: row ``t`` marks task ``t``'s classes among the head's ``K``."""
    table = torch.zeros(len(task_classes), num_classes, dtype=torch.bool)
    for t, classes in enumerate(task_classes):
        table[t, list(classes)] = True
    return table


def current_task_cross_entropy(logits: torch.Tensor, y: torch.Tensor, task: torch.Tensor, weight: torch.Tensor,
                               table: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy ``(B,)`` whose softmax runs over each sample's own task's classes only (``table``
    ``(T, K)``: :func:`task_class_table`; the other tasks' logits set to ``-inf``, as the official prompt code's
    ``logits[:, :last_valid_out_dim] = -inf``); 0 on padding (``weight`` 0)."""
    allowed = table.to(logits.device)[task]  # (B, K)
    logp = F.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    ce = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    return torch.where(weight > 0, ce, torch.zeros_like(ce))
