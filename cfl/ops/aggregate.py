"""Server aggregation rules: pure functions over client updates stacked as (C, ...) tensors."""

from __future__ import annotations

import torch

Params = dict[str, torch.Tensor]


def _shares(weights: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    shares = weights / weights.sum()
    return shares.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def weighted_mean(deltas: Params, weights: torch.Tensor) -> Params:
    """FedAvg: ``sum_n (s_n / sum s) d_n`` with ``s_n`` the clients' sample counts."""
    return {k: (_shares(weights, d) * d).sum(0) for k, d in deltas.items()}


def gradient_masked_mean(deltas: Params, weights: torch.Tensor, tau: float) -> Params:
    """GMA (Tenison et al. 2023, eq. 5): the mean scaled per coordinate by the clients' sign agreement.

    ``A_j = |mean_n sign(D_n,j)|``; mask ``m_j = 1 if A_j >= tau else A_j``; returns ``m * sum_n D_n``
    with ``D_n = (s_n / sum s) d_n``. ``tau = 0`` gives plain weighted averaging.
    """
    out = {}
    for k, d in deltas.items():
        scaled = _shares(weights, d) * d
        agreement = torch.sign(scaled).mean(0).abs()
        mask = torch.where(agreement >= tau, torch.ones_like(agreement), agreement)
        out[k] = mask * scaled.sum(0)
    return out


def aggregate(name: str, deltas: Params, weights: torch.Tensor, tau: float) -> Params:
    if name == "gma":
        return gradient_masked_mean(deltas, weights, tau)
    return weighted_mean(deltas, weights)
