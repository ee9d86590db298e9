"""One client step's loss of the data-free methods, on a real batch and a synthetic one, through ``functional_call``
of a cfl model (``forward(x, task)`` ending in ``head(features, task)``), so a method hook can call it with the
client's parameters.

- TARGET (``_local_finetune``): two forwards in training mode, one on the real batch and one on the synthetic
  batch (so BatchNorm normalises each with its own batch statistics):
  ``mean CE over the new classes (real) + kd * mean soft-CE_T over the old classes (synthetic vs old model)``.
- MFCL (``train_cl``): ONE forward on real and synthetic samples together, the features kept:
  :func:`cfl.ops.mfcl_losses.client_loss` on the logits, the head on the detached features, and the old head on
  the current and on the old model's features (the old model in eval mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from cfl.ops.distill import evaluating
from cfl.ops.mfcl_losses import ClientTerms, client_loss
from cfl.ops.target_losses import new_class_cross_entropy, old_class_distillation
from cfl.tensors import Params


def logits_and_features(model: nn.Module, params: Params, x: torch.Tensor,
                        task: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, features)`` of one forward with gradients; ``features`` is the input of ``model.head``."""
    captured: list[torch.Tensor] = []
    handle = model.head.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        logits = functional_call(model, params, (x, task))
    finally:
        handle.remove()
    return logits, captured[0].flatten(1)


def _tasks(x: torch.Tensor, task: int) -> torch.Tensor:
    return torch.full((x.shape[0],), task, dtype=torch.long, device=x.device)


@dataclass(frozen=True)
class ClassSets:
    """Bool ``(K,)`` masks: the current task's classes, the earlier ones, all seen (their union)."""

    new: torch.Tensor
    old: torch.Tensor

    @property
    def seen(self) -> torch.Tensor:
        return self.new | self.old


def target_client_loss(model: nn.Module, params: Params, old_params: Params, x: torch.Tensor, y: torch.Tensor,
                       x_syn: torch.Tensor, classes: ClassSets, task: int, kd: float = 25.0,
                       temperature: float = 2.0) -> dict[str, torch.Tensor]:
    """TARGET's client loss: ``ce`` on the real batch over the new classes, ``kd`` the mean old-class soft-CE of the
    synthetic batch against the old model (eval mode, no gradient), ``total = ce + kd * kd``."""
    ce = new_class_cross_entropy(functional_call(model, params, (x, _tasks(x, task))), y, classes.new).mean()
    student = functional_call(model, params, (x_syn, _tasks(x_syn, task)))
    with torch.no_grad(), evaluating(model):
        teacher = functional_call(model, old_params, (x_syn, _tasks(x_syn, task)))
    distil = old_class_distillation(student, teacher, classes.old, temperature).mean()
    return {"ce": ce, "kd": distil, "total": ce + kd * distil}


def mfcl_client_loss(model: nn.Module, params: Params, old_params: Params, x: torch.Tensor, y: torch.Tensor,
                     x_syn: torch.Tensor, classes: ClassSets, task: int, w_ft: float = 1.0,
                     w_kd: float = 0.1) -> dict[str, torch.Tensor]:
    """MFCL's client loss on the real batch ``(x, y)`` and the synthetic images ``x_syn``, labelled by the old
    model's argmax over the old classes; the old head is the old model's head (``old_params``)."""
    x_all = torch.cat([x, x_syn])
    tasks = _tasks(x_all, task)
    with torch.no_grad(), evaluating(model):
        old_logits, old_features = logits_and_features(model, old_params, x_all, tasks)
        y_syn = old_logits[len(x):].masked_fill(~classes.old, float("-inf")).argmax(-1)
    logits, features = logits_and_features(model, params, x_all, tasks)
    head = {k.removeprefix("head."): v for k, v in params.items() if k.startswith("head.")}
    old_head = {k.removeprefix("head."): v.detach() for k, v in old_params.items() if k.startswith("head.")}
    real = torch.zeros(len(x_all), dtype=torch.bool, device=x.device)
    real[: len(x)] = True
    terms = ClientTerms(
        logits=logits,
        frozen_feature_logits=functional_call(model.head, head, (features.detach(), tasks)),
        student_old_logits=functional_call(model.head, old_head, (features, tasks)),
        teacher_old_logits=functional_call(model.head, old_head, (old_features, tasks)),
        y=torch.cat([y, y_syn]), real=real, weight=torch.ones(len(x_all), dtype=logits.dtype, device=x.device))
    return client_loss(terms, classes.new, classes.seen, classes.old, w_ft, w_kd)
