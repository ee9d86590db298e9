"""FedWeIT's client regularisers (cfl/ops/fedweit_losses.py) for a client with its own order of tasks (FedWeIT's
own setting: each client learns its own sequence; cfl's schedules, cfl/schedules.py).

The per-task parameters stay indexed by the stream's task id; a client's past tasks are those it has trained
before its current one, whatever their ids: a 0/1 vector ``past`` ``(T,)``, and ``anchors[p]`` ``(T, out, ...)``
the stored ``theta^(i)`` at the rows of the past tasks (0 elsewhere). The current task is a one-hot ``(T,)`` (a
tensor, so that the terms run under ``vmap`` for clients at different positions of their orders). The terms are
:func:`cfl.ops.fedweit_losses.layer_regulariser`'s with ``i < t`` read as "``i`` in ``past``", and the base's decay
on the client's first task.
"""

from __future__ import annotations

import torch

from cfl.ops.fedweit_losses import RegulariserWeights, past_weights, sparsity_loss, squared
from cfl.tensors import Params


def _rows(vector: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``vector`` ``(T,)`` viewed to broadcast over ``like`` ``(T, ...)``."""
    return vector.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def own_anchors(params: Params, prefixes: list[str], past: torch.Tensor) -> Params:
    """Per layer ``(T, out, ...)``: the stored weights of the tasks in ``past`` (taken when the client begins a
    task, from its own base), 0 at the other rows."""
    out = {}
    for p in prefixes:
        weights = past_weights(params[f"{p}.base"], params[f"{p}.mask"], params[f"{p}.adaptive"]).detach()
        out[p] = weights * _rows(past, weights)
    return out


def layer_regulariser_own(params: Params, prefix: str, current: torch.Tensor, past: torch.Tensor,
                          anchors: torch.Tensor, w: RegulariserWeights) -> torch.Tensor:
    """One decomposed layer's regularisers while the client trains the task ``current`` (one-hot ``(T,)``), its
    past tasks ``past`` (0/1 ``(T,)``)."""
    base, mask, adaptive = params[f"{prefix}.base"], params[f"{prefix}.mask"], params[f"{prefix}.adaptive"]
    a_now = (adaptive * _rows(current, adaptive)).sum(0)
    m_now = (mask * _rows(current, mask)).sum(0)
    kept = adaptive if w.past_adaptive_trained else adaptive.detach()
    loss = sparsity_loss(a_now, m_now, w.lambda_l1, w.lambda_mask)
    loss = loss + w.lambda_l1 * (kept * _rows(past, kept)).abs().sum()
    loss = loss + w.wd * (squared(a_now, w.halved) + squared(m_now, w.halved))
    first = 1 - past.max().to(base.dtype)  # the client's first task: the base decays, no drift
    loss = loss + first * w.wd * squared(base, w.halved)
    drift = (past_weights(base, mask.detach(), kept) - anchors) * _rows(past, anchors)
    return loss + w.lambda_l2 * squared(drift, w.halved)


def regulariser_own(params: Params, prefixes: list[str], current: torch.Tensor, past: torch.Tensor,
                    anchors: Params, w: RegulariserWeights) -> torch.Tensor:
    """:func:`layer_regulariser_own` summed over the decomposed layers ``prefixes``."""
    return sum((layer_regulariser_own(params, p, current, past, anchors[p], w) for p in prefixes),
               start=params[f"{prefixes[0]}.base"].new_zeros(()))
