"""MFCL's losses (Babakniya et al., "A Data-Free Approach to Mitigate Catastrophic Forgetting in Federated
Class Incremental Learning for Vision Tasks", NeurIPS 2023), restated from the official code
(``SaraBabakN/MFCL-NeurIPS23``: ``clients/helper.py``, ``clients/MFCL.py``).

Server, per generator step on the frozen global model's logits over the seen classes:
``w_ce * CE(logits / 1000, argmax logits) + w_ie * (1 + sum p log p / log K) + w_bn * L_BN + w_smooth * L_smooth``
(L_BN: :func:`cfl.ops.bn_statistics.gaussian_statistics_loss`). Clients, each step, on their real batch and a
synthetic batch: CE over the new classes on the real new-class samples, ``w_ft *`` CE over all seen classes on
detached features (real + synthetic), ``w_kd *`` the old head's squared logit gap (:func:`feature_distillation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cfl.ops.losses import masked_cross_entropy, weighted_mean


@dataclass(frozen=True)
class MfclWeights:
    """The generator objective's weights and CE temperature (official defaults)."""

    ce: float = 1.0
    ie: float = 1.0
    bn: float = 50.0
    smooth: float = 1e-3
    temperature: float = 1000.0


def content_cross_entropy(logits: torch.Tensor, temperature: float = 1000.0) -> torch.Tensor:
    """Mean ``CE(logits / T, argmax logits)`` over the batch: each sample pushed toward the class the teacher already
    gives it (T = 1000 makes it gentle)."""
    return F.cross_entropy(logits / temperature, logits.argmax(-1))


def information_entropy_loss(logits: torch.Tensor) -> torch.Tensor:
    """``1 + sum_c p_c log p_c / log K``, ``p`` the batch's mean softmax over the ``K`` classes: 0 when the batch's
    predictions spread evenly over the classes, 1 when they all fall on one. A class whose mean probability
    underflows to 0 adds 0 (the code's ``p log p`` gives NaN there)."""
    k = logits.shape[-1]
    if k < 2:
        raise ValueError(f"the information-entropy term needs at least 2 classes, the teacher's logits have {k}")
    p = F.softmax(logits, dim=-1).mean(0)
    return 1.0 + (p * torch.log(p.clamp(min=torch.finfo(p.dtype).tiny))).sum() / math.log(k)


def gaussian_kernel(size: int = 5, sigma: float = 1.0, code_quirk: bool = True) -> torch.Tensor:
    """The normalised 2-D Gaussian smoothing kernel ``(size, size)``. The code writes ``exp(-((d) / (2 sigma))^2)``,
    i.e. a standard deviation of ``sqrt(2) sigma``; ``code_quirk=False`` gives ``exp(-d^2 / (2 sigma^2))``."""
    d = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    one = torch.exp(-((d / (2 * sigma)) ** 2)) if code_quirk else torch.exp(-(d**2) / (2 * sigma**2))
    kernel = torch.outer(one, one)
    return kernel / kernel.sum()


def smoothness_loss(images: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Mean squared difference between ``images`` ``(B, C, H, W)`` and their Gaussian blur (reflect-padded so the
    size stays): small for smooth images."""
    pad = kernel.shape[-1] // 2
    channels = images.shape[1]
    weight = kernel.to(images).expand(channels, 1, *kernel.shape)
    blurred = F.conv2d(F.pad(images, (pad, pad, pad, pad), mode="reflect"), weight, groups=channels)
    return F.mse_loss(images, blurred)


def generator_objective(logits: torch.Tensor, bn_loss: torch.Tensor, images: torch.Tensor, kernel: torch.Tensor,
                        weights: MfclWeights) -> dict[str, torch.Tensor]:
    """The parts ``ce``, ``ie``, ``bn``, ``smooth`` (unweighted) and their weighted ``total``; ``logits`` are the
    teacher's over the seen classes only."""
    parts = {"ce": content_cross_entropy(logits, weights.temperature), "ie": information_entropy_loss(logits),
             "bn": bn_loss, "smooth": smoothness_loss(images, kernel)}
    total = (weights.ce * parts["ce"] + weights.ie * parts["ie"] + weights.bn * parts["bn"]
             + weights.smooth * parts["smooth"])
    return {**parts, "total": total}


def feature_distillation(student_old_logits: torch.Tensor, teacher_old_logits: torch.Tensor,
                         old: torch.Tensor) -> torch.Tensor:
    """Per sample, the mean over the ``old`` classes of ``(h_old(f(x)) - h_old(f_old(x)))^2``: the current features
    ``f(x)`` and the old model's through the OLD head ``h_old``; the teacher side is detached. (The old head's
    bias cancels: only the features' gap seen through its weights counts.)"""
    cols = old.to(student_old_logits.dtype)
    gap = (student_old_logits - teacher_old_logits.detach()) ** 2
    return (gap * cols).sum(-1) / cols.sum(-1).clamp(min=1.0)


@dataclass(frozen=True)
class ClientTerms:
    """One client step's inputs, real and synthetic samples stacked (real first): ``logits`` (B, K) with gradient;
    ``frozen_feature_logits`` the head on the detached features; ``student_old_logits`` / ``teacher_old_logits``
    the old head on the current / old model's features; ``y`` labels (synthetic: the old model's argmax over the
    old classes); ``real`` (B,) bool; ``weight`` (B,) 0 marks padding."""

    logits: torch.Tensor
    frozen_feature_logits: torch.Tensor
    student_old_logits: torch.Tensor
    teacher_old_logits: torch.Tensor
    y: torch.Tensor
    real: torch.Tensor
    weight: torch.Tensor


def client_loss(terms: ClientTerms, new: torch.Tensor, seen: torch.Tensor, old: torch.Tensor, w_ft: float = 1.0,
                w_kd: float = 0.1) -> dict[str, torch.Tensor]:
    """MFCL's client loss (``clients/MFCL.py``, ``train_cl``): ``new`` = the mean over the real samples of a new
    class of CE over the ``new`` columns; ``ft`` = the mean over all samples of CE over the ``seen`` columns of the
    head on detached features; ``kd`` = the mean over all samples of :func:`feature_distillation`;
    ``total = new + w_ft * ft + w_kd * kd``."""
    y_new = new.to(terms.y.device)[terms.y]
    on_new = terms.weight * (terms.real & y_new).to(terms.weight.dtype)
    parts = {"new": weighted_mean(masked_cross_entropy(terms.logits, terms.y, new), on_new),
             "ft": weighted_mean(masked_cross_entropy(terms.frozen_feature_logits, terms.y, seen), terms.weight),
             "kd": weighted_mean(feature_distillation(terms.student_old_logits, terms.teacher_old_logits, old),
                                 terms.weight)}
    return {**parts, "total": parts["new"] + w_ft * parts["ft"] + w_kd * parts["kd"]}
