"""TARGET's losses (Zhang et al., "TARGET: Federated Class-Continual Learning via Exemplar-Free Distillation",
ICCV 2023), restated from the official code (``zj-jayzhang/Federated-Class-Continual-Learning``, ``methods/target.py``).

Server, per generator step: ``bn * L_BN + oh * CE(teacher(x), targets) + adv * L_adv`` (L_BN:
:func:`cfl.ops.bn_statistics.l2_statistics_loss`); the student learns from the teacher on the synthetic pool with
:func:`student_distillation`. Clients, each step: :func:`new_class_cross_entropy` on their real batch plus
``kd *`` :func:`old_class_distillation` on a synthetic batch.

Shapes: ``logits`` (..., B, K); class masks (K,) bool. Per-sample functions return (..., B).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cfl.ops.distill import soft_kl
from cfl.ops.losses import masked_cross_entropy


@dataclass(frozen=True)
class TargetWeights:
    """The generator objective's weights (official CIFAR-100 preset: bn 10, oh 0.5, adv 1)."""

    bn: float = 10.0
    oh: float = 0.5
    adv: float = 1.0


def adversarial_term(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """``-mean_b [argmax s_b == argmax t_b] KL(softmax(t_b) || softmax(s_b))``: the generator seeks samples on which
    the student, where it still agrees with the teacher, differs most from it (the mean runs over the whole
    batch, the disagreeing samples counting 0, as in the code)."""
    agree = (student_logits.argmax(-1) == teacher_logits.argmax(-1)).to(teacher_logits.dtype)
    return -(soft_kl(teacher_logits, student_logits, 1.0) * agree).mean(-1)


def generator_objective(bn_loss: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                        student_logits: torch.Tensor | None, weights: TargetWeights) -> dict[str, torch.Tensor]:
    """The parts ``bn``, ``ce`` (mean cross-entropy of the teacher toward the sampled labels), ``adv`` (0 without
    a student: before the warm-up ends; its gradient reaches the images through both models, as in the code) and
    their weighted ``total``."""
    ce = F.cross_entropy(teacher_logits, targets)
    adv = ce.new_zeros(()) if student_logits is None else adversarial_term(student_logits, teacher_logits)
    total = weights.bn * bn_loss + weights.oh * ce + weights.adv * adv
    return {"bn": bn_loss, "ce": ce, "adv": adv, "total": total}


def student_distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                         temperature: float = 20.0) -> torch.Tensor:
    """The server student's loss on a synthetic batch: ``T^2 * mean_b KL(softmax(t/T) || softmax(s/T))`` (T = 20
    in the preset); the teacher is detached."""
    return temperature**2 * soft_kl(teacher_logits.detach(), student_logits, temperature).mean(-1)


def new_class_cross_entropy(logits: torch.Tensor, y: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Per sample, the cross-entropy whose softmax runs over the current task's classes ``new`` only (the code's
    ``CE(output[:, known:], y - known)``: the old columns get no push down from real data)."""
    return masked_cross_entropy(logits, y, new)


def old_class_distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor, old: torch.Tensor,
                           temperature: float = 2.0) -> torch.Tensor:
    """Per synthetic sample, the code's ``_KD_loss``: the soft cross-entropy
    ``-sum_{c old} softmax(t/T)_c log softmax(s/T)_c``, both softmaxes over the ``old`` classes, no ``T^2`` (it
    equals ``KL_T(t || s)`` plus the teacher's entropy, so the same gradient). The code's batch value is the
    mean over the synthetic batch."""
    fill = ~old.unsqueeze(-2)
    log_q = F.log_softmax((student_logits / temperature).masked_fill(fill, float("-inf")), dim=-1)
    p = F.softmax((teacher_logits.detach() / temperature).masked_fill(fill, float("-inf")), dim=-1)
    return -(p * log_q.masked_fill(fill, 0.0)).sum(-1)
