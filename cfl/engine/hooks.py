"""The engine's side of the one-client training hooks: a declared quadratic penalty as a loss and as the
``A * w - B`` terms of its gradient, the per-sample extra loss averaged over real samples, and the
gradient projection. Each function takes one client; the batched trainer ``vmap``s them over clients."""

from __future__ import annotations

import torch
from torch.func import vmap

from cfl.methods.base import Method, Quadratic
from cfl.ops.losses import weighted_mean
from cfl.ops.subspace import project_out
from cfl.tensors import Params, State

PenaltyTerms = dict[str, tuple[torch.Tensor, torch.Tensor]]  # name -> (A, B) of the gradient A * w - B


def quadratic_loss(params: Params, quadratics: dict[str, Quadratic] | None) -> torch.Tensor:
    """``sum_k weight_k / 2 * (w_k - anchor_k)^2`` (0 without quadratics)."""
    total = torch.zeros((), device=next(iter(params.values())).device)
    for k, q in (quadratics or {}).items():
        total = total + (q.weight * (params[k] - q.anchor) ** 2).sum()
    return 0.5 * total


def penalty_loss(method: Method, params: Params, global_params: Params, server: State, state: State) -> torch.Tensor:
    """One client's penalty, derived from its declared quadratics."""
    return quadratic_loss(params, method.penalty(global_params, server, state))


def _terms(method: Method, global_params: Params, server: State, state: State) -> PenaltyTerms:
    out = {}
    for k, q in (method.penalty(global_params, server, state) or {}).items():
        like = global_params[k]
        weight = q.weight if isinstance(q.weight, torch.Tensor) else torch.tensor(q.weight, dtype=like.dtype,
                                                                                   device=like.device)
        out[k] = (weight, q.anchor * q.weight)
    return out


def penalty_terms(method: Method, global_params: Params, server: State, stacked: State) -> PenaltyTerms:
    """``(A, B)`` per parameter for the clients of the ``stacked`` state, with a leading client dim (1 when
    no client has state: the same terms for all)."""
    if stacked:
        return vmap(lambda st: _terms(method, global_params, server, st))(stacked)
    return {k: (a.unsqueeze(0), b.unsqueeze(0)) for k, (a, b) in _terms(method, global_params, server, {}).items()}


def extra_loss(method: Method, params: Params, x: torch.Tensor, task: torch.Tensor, weight: torch.Tensor,
               server: State, state: State) -> torch.Tensor:
    """One client's extra loss averaged over its real samples (``weight`` 0 marks padding)."""
    return weighted_mean(method.extra_loss(params, x, task, server, state), weight)


def project(grads: Params, bases: dict[str, torch.Tensor]) -> Params:
    """Gradients with their component in each basis removed (GPM: ``g - (g M) M^T``)."""
    return {k: project_out(g, bases[k]) if k in bases else g for k, g in grads.items()}


def projected(method: Method, grads: Params, state: State) -> Params:
    """One client's gradients projected off ``method.gradient_projection``."""
    return project(grads, method.gradient_projection(state))
