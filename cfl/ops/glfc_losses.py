"""GLFC's two client losses (Dong et al., "Federated Class-Incremental Learning", CVPR 2022, arXiv 2203.11473),
per sample and over any leading dims, so one client and a ``vmap``-ed stack of clients compute the same numbers.

Two forms. ``code`` (default): the official code (``conditionWang/FCIL``, ``src/GLFC.py``), which produced the
paper's numbers, writes both losses with sigmoid / binary cross-entropy over the seen classes' columns.
``paper``: the paper's text writes them with softmax / cross-entropy and a KL divergence.

Shapes: ``logits`` (..., B, K); ``y`` (..., B) int; ``weight`` (..., B), 0 marks padding (left out of every
batch mean); ``seen`` (..., K) bool: the classes learned so far, current task's included (the columns the losses
run over); ``old`` (..., K) bool: the old classes of ``L_GC``'s groups, those the client learned at earlier task
ends (a subset of ``seen``; none on the first task); ``finished`` (..., K) bool: the classes ``L_RD`` distils, every
class of the finished tasks (the official code replaces the first ``old_model(x).shape[1]`` target columns, the old
model's classes, whether or not the client ever held them).
No function branches on data: empty groups give masked means of 0, never a Python ``if``.

:func:`glfc_loss_by_task` is cfl's adaptation to task- and domain-incremental streams: the groups are by task (a
memory sample of a finished task is old, with its whole row), not by class column.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Form = Literal["code", "paper"]
FORMS: tuple[Form, ...] = ("code", "paper")

#: a group mean of gradient magnitudes below this counts as this (only where every magnitude of a group is 0, i.e.
#: saturated sigmoids, where the official code divides 0 by 0)
_TINY = 1e-12


def _column_mean(per_class: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """``per_class`` (..., B, K) averaged over the ``seen`` columns: (..., B)."""
    cols = seen.to(per_class.dtype).unsqueeze(-2)
    return (per_class * cols).sum(-1) / cols.sum(-1).clamp(min=1.0)


def _seen_log_softmax(logits: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` over the ``seen`` columns only (-inf elsewhere)."""
    return F.log_softmax(logits.masked_fill(~seen.unsqueeze(-2), float("-inf")), dim=-1)


def _picked(values: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``values[..., b, y_b]``: (..., B)."""
    return values.gather(-1, y.unsqueeze(-1)).squeeze(-1)


def compensation_weights(g: torch.Tensor, is_old: torch.Tensor, weight: torch.Tensor,
                         any_old: torch.Tensor) -> torch.Tensor:
    """GLFC's class-aware weights: ``w_i = g_i / mean(g over the batch's real samples of i's group)``, the groups
    being old-class and new-class samples; ``w_i = 1`` for every sample while no class is old (``any_old`` False,
    (...,) bool), as the official code does on a client's first task.

    ``g`` (..., B) gradient magnitudes (detached), ``is_old`` (..., B) bool, ``weight`` (..., B) padding mask."""
    real = (weight > 0).to(g.dtype)
    old_s, new_s = is_old.to(g.dtype) * real, (~is_old).to(g.dtype) * real
    mean_old = (g * old_s).sum(-1, keepdim=True) / old_s.sum(-1, keepdim=True).clamp(min=1.0)
    mean_new = (g * new_s).sum(-1, keepdim=True) / new_s.sum(-1, keepdim=True).clamp(min=1.0)
    w = g * (old_s / mean_old.clamp(min=_TINY) + new_s / mean_new.clamp(min=_TINY))
    return torch.where(any_old.unsqueeze(-1), w, torch.ones_like(w))


def gradient_compensation(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, seen: torch.Tensor,
                          old: torch.Tensor, form: Form = "code") -> torch.Tensor:
    """L_GC per sample (..., B): ``w_i`` times the sample's classification loss, which it replaces.

    code: ``g_i = |sigmoid(z_i,y_i) - 1|``, loss = mean over the seen columns of ``BCE(z_ic, onehot(y_i)_c)``
    (the code's ``mean(w * BCE)`` over the batch and the seen columns is the batch mean of this).
    paper: ``g_i = |softmax(z_i)_y_i - 1|`` (softmax over the seen classes), loss = the cross-entropy."""
    onehot = F.one_hot(y, logits.shape[-1]).to(logits.dtype)
    g, base = _magnitude_and_loss(logits, y, onehot, seen, form)
    is_old = (onehot * old.to(logits.dtype).unsqueeze(-2)).sum(-1) > 0
    return compensation_weights(g, is_old, weight, old.any(-1)) * base


def _magnitude_and_loss(logits: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor, seen: torch.Tensor,
                        form: Form) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample (..., B): the gradient magnitude ``g`` (detached) and the classification loss it weighs."""
    if form == "code":
        p_y = _picked(torch.sigmoid(logits), y)
        base = _column_mean(F.binary_cross_entropy_with_logits(logits, onehot, reduction="none"), seen)
    else:
        log_p_y = _picked(_seen_log_softmax(logits, seen), y)
        p_y, base = log_p_y.exp(), -log_p_y
    return (p_y - 1).abs().detach(), base


def relation_distillation(logits: torch.Tensor, y: torch.Tensor, old_logits: torch.Tensor, seen: torch.Tensor,
                          old: torch.Tensor, form: Form = "code") -> torch.Tensor:
    """L_RD per sample (..., B): the current model matched to the one-hot label whose old-class entries (``old``: in
    GLFC every class of the finished tasks, the ``finished`` of :func:`glfc_loss`) are the old model's outputs
    (``old_logits``, same shape as ``logits``, detached here); no temperature.

    code: target = one-hot with the ``old`` entries replaced by ``sigmoid(old_logits)``; loss = mean over the seen
    columns of ``BCE(z, target)``.
    paper: ``D_KL(target || softmax(z))`` over the seen classes, target = one-hot with the ``old`` entries replaced by
    the old model's softmax over the old classes, scaled to sum to 1 (our reading: the paper concatenates the two
    and names a KL divergence, which needs a distribution; on a new-class sample the two halves weigh 1/2 each)."""
    return _distillation(logits, y, old_logits, seen, old.unsqueeze(-2), form)


def _distillation(logits: torch.Tensor, y: torch.Tensor, old_logits: torch.Tensor, seen: torch.Tensor,
                  old_cols: torch.Tensor, form: Form) -> torch.Tensor:
    """:func:`relation_distillation` with the old entries ``old_cols`` (..., B or 1, K) given per sample."""
    onehot = F.one_hot(y, logits.shape[-1]).to(logits.dtype)
    old_logits = old_logits.detach()
    if form == "code":
        target = torch.where(old_cols, torch.sigmoid(old_logits), onehot)
        return _column_mean(F.binary_cross_entropy_with_logits(logits, target, reduction="none"), seen)
    old_p = F.softmax(old_logits.masked_fill(~old_cols, float("-inf")), dim=-1).nan_to_num(0.0)  # no old: 0
    target = torch.where(old_cols, old_p, onehot)
    target = target / target.sum(-1, keepdim=True)
    log_q = _seen_log_softmax(logits, seen).masked_fill(~seen.unsqueeze(-2), 0.0)
    return (torch.xlogy(target, target) - target * log_q).sum(-1)


def glfc_loss(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, seen: torch.Tensor, old: torch.Tensor,
              finished: torch.Tensor, old_logits: torch.Tensor | None, form: Form = "code") -> torch.Tensor:
    """GLFC's per-sample client loss, replacing the cross-entropy: ``L_GC`` (groups by the client's learned classes
    ``old``) while there is no old model, else ``0.5 L_GC + 0.5 L_RD`` (the official code's weights), ``L_RD``
    distilling every class of the finished tasks (``finished``)."""
    gc = gradient_compensation(logits, y, weight, seen, old, form)
    if old_logits is None:
        return gc
    return 0.5 * gc + 0.5 * relation_distillation(logits, y, old_logits, seen, finished, form)


def glfc_loss_by_task(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, seen: torch.Tensor,
                      old_samples: torch.Tensor, any_old: torch.Tensor, old_logits: torch.Tensor | None,
                      form: Form = "code") -> torch.Tensor:
    """:func:`glfc_loss` with the old/new groups by task, cfl's adaptation to task- and domain-incremental streams
    (the official code and the paper are class-incremental): ``old_samples`` (..., B) bool marks the samples of a
    task the client has finished (its memory's), whose whole row (its own head, task-incremental; the shared head,
    domain-incremental) is old; ``any_old`` (...,) bool: whether the client has finished a task (else ``w_i = 1``).

    ``L_GC``: the weights of :func:`compensation_weights` with these groups. ``L_RD``: an old sample's target is the
    old model's output on all its seen columns, a new sample's the one-hot label."""
    onehot = F.one_hot(y, logits.shape[-1]).to(logits.dtype)
    g, base = _magnitude_and_loss(logits, y, onehot, seen, form)
    gc = compensation_weights(g, old_samples, weight, any_old) * base
    if old_logits is None:
        return gc
    old_cols = old_samples.unsqueeze(-1) & seen.unsqueeze(-2)
    return 0.5 * gc + 0.5 * _distillation(logits, y, old_logits, seen, old_cols, form)
