"""CODA-Prompt's per-task component slices (Smith et al., CVPR 2023, Sec. 4.2: the components of earlier tasks
are frozen and each task adds its own; official code github.com/GT-RIPL/CODA-Prompt, models/zoo.py, commit 605ac87
``CodaPrompt``): of a pool of ``M`` components over ``T`` tasks, task ``t`` owns rows ``t * pt`` to
``(t + 1) * pt - 1`` with ``pt = M // T`` (the code's ``s`` and ``f``). :func:`gram_schmidt` is the code's
``gram_schmidt`` at the start of a task: rows before ``s`` kept, rows ``s .. f - 1`` drawn from N(0, 1) and
orthogonalised against every row before them (classical Gram-Schmidt, each new row normalised at the end), the
rows from ``f`` on zero. A zero row adds nothing to the prompt ``sum_m alpha_m P_m`` (its key normalises to zero,
so ``alpha_m`` is 0) and gets no gradient: zero rows are the code's exclusion of later tasks' components."""

from __future__ import annotations

import torch


def task_slice(pool: int, num_tasks: int, task: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` task ``task`` owns (the code's ``s``, ``f``; ``pt = pool // num_tasks``)."""
    per_task = pool // num_tasks
    return task * per_task, (task + 1) * per_task


def layer_rows(tensor: torch.Tensor, layered: bool) -> list[torch.Tensor]:
    """``tensor``'s component sets as ``(M, n)`` matrices (views): one per prefix layer (``layered``: its second
    dim), else the one set, each row one component flattened."""
    pool = tensor.shape[0]
    if not layered:
        return [tensor.view(pool, -1)]
    return [tensor[:, i].reshape(pool, -1) for i in range(tensor.shape[1])]


def from_layer_rows(rows: list[torch.Tensor], like: torch.Tensor, layered: bool) -> torch.Tensor:
    """The inverse of :func:`layer_rows`: a tensor shaped like ``like``."""
    if not layered:
        return rows[0].view_as(like)
    return torch.stack([r.view(like.shape[0], *like.shape[2:]) for r in rows], 1)


def gram_schmidt(rows: torch.Tensor, start: int, stop: int, generator: torch.Generator) -> torch.Tensor:
    """The official ``gram_schmidt`` of a ``(M, n)`` set: rows ``[0, start)`` kept, ``[start, stop)`` new (each a
    draw ``v ~ N(0, I)`` from ``generator``, in row order, minus its projections on every row before it, then all
    normalised), rows from ``stop`` zero. A zero row before a new one is refused (the code redraws forever)."""
    if stop > rows.shape[1]:
        raise ValueError(f"{stop} components of width {rows.shape[1]} cannot be orthogonal; lower model.prompt_pool "
                         f"to at most {rows.shape[1]}")
    out = torch.zeros_like(rows)
    out[:start] = rows[:start]
    for k in range(start, stop):
        v = torch.randn(rows.shape[1], generator=generator, dtype=rows.dtype).to(rows.device)
        before = out[:k]
        squared = (before * before).sum(1)
        if bool((squared < 1e-8).any()):
            raise ValueError(f"component {int((squared < 1e-8).nonzero()[0, 0])} is zero: the next task's components "
                             "cannot be orthogonalised against it")
        out[k] = v - ((before @ v) / squared) @ before
    out[start:stop] = out[start:stop] / out[start:stop].norm(dim=1, keepdim=True)
    return out
