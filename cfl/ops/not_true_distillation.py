"""Not-true distillation (FedNTD, Lee et al., NeurIPS 2022, "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", Eq. 4): the KL divergence between the teacher's and the student's softened
distributions over the classes other than the sample's true one, ``tau^2 * KL(softmax(t / tau) || softmax(s /
tau))`` on the not-true logits. Powder (official code github.com/piaohongming/Powder at ae7beeb,
``src/prompt_hard.py`` ``_ntd_loss``) uses it with tau 3 on the task's classes, the samples weighted by a softmax
over the batch (:func:`batch_softmax_weights`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(B, K - 1)``: each row's logits without the one of its label (the others in order)."""
    classes = logits.shape[-1]
    keep = torch.arange(classes, device=logits.device).unsqueeze(0) != y.unsqueeze(1)  # (B, K)
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, : classes - 1]  # the kept columns first
    return logits.gather(1, order)


def not_true_distillation(student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """Per sample ``tau^2 * KL(softmax(t' / tau) || softmax(s' / tau))`` of the not-true logits ``s'``, ``t'``."""
    s = F.log_softmax(not_true_logits(student, y) / tau, dim=1)
    t = F.log_softmax(not_true_logits(teacher, y) / tau, dim=1)
    return tau**2 * (t.exp() * (t - s)).sum(1)


def batch_softmax_weights(scores: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A softmax of ``scores`` over the batch's real samples (``weight`` > 0; padding gets 0, and a batch of
    padding only all 0)."""
    real = weight > 0
    masked = torch.where(real, scores, torch.full_like(scores, torch.finfo(scores.dtype).min))
    return torch.softmax(masked, dim=0) * real.to(scores.dtype)
