"""Knowledge distillation on old heads (LwF, Li & Hoiem 2016): one client's per-sample loss, written for vmap.

A teacher is a frozen copy of the model's parameters with a weight per head: 1 for the heads it has trained
(task-incremental: the tasks up to its own; one shared head otherwise), 0 for the others (and for a client
without that teacher: the engine stacks a missing state as zeros). The loss never branches on data, so one
client and a stack of clients (``torch.func.vmap``) compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from cfl.tensors import Params


@dataclass
class Teacher:
    """A frozen model, the weight of each of its heads (``(H,)``) and the coefficient of its term."""

    params: Params
    heads: torch.Tensor
    coef: float


def soft_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per sample ``KL(softmax(teacher/T) || softmax(student/T))``: LwF's soft cross-entropy
    ``-sum_c p_c log q_c`` less the teacher's entropy, a constant, so the same gradient (and 0 at the teacher)."""
    log_p = F.log_softmax(teacher_logits / temperature, dim=-1)
    log_q = F.log_softmax(student_logits / temperature, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def head_weights(num_tasks: int, scenario: str, task: int, device: torch.device | str) -> torch.Tensor:
    """The heads a model trained up to ``task`` (0-based) knows: one per task for task-incremental streams
    (1 for tasks ``<= task``), else the one shared head."""
    if scenario != "task":
        return torch.ones(1, device=device)
    return (torch.arange(num_tasks, device=device) <= task).float()


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the block (dropout off), its former mode after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def distillation(model: nn.Module, student: Params, x: torch.Tensor, task: torch.Tensor,
                 teachers: Sequence[Teacher], temperature: float) -> torch.Tensor:
    """Per sample ``sum_k coef_k sum_j heads_k[j] KL_T(teacher_k(x, j) || student(x, j))`` ``(B,)``.

    One student forward (in the model's training mode) and one forward per teacher for each head ``j``; the
    teachers run in eval mode, as LwF records the old network's responses (no dropout), and get no gradient."""
    total = torch.zeros(x.shape[0], device=x.device)
    for j in range(len(teachers[0].heads)):
        head = torch.full_like(task, j)
        logits = functional_call(model, student, (x, head))
        for teacher in teachers:
            with evaluating(model):
                target = functional_call(model, teacher.params, (x, head)).detach()
            total = total + teacher.coef * teacher.heads[j] * soft_kl(target, logits, temperature)
    return total


def frozen(params: Params) -> Params:
    """Detached copies of ``params`` (``client_end`` gets views that the engine reuses)."""
    return {k: v.detach().clone() for k, v in params.items()}
