"""Server aggregation rules: pure functions over client updates stacked as (C, ...) tensors."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cfl.registry import Registry
from cfl.tensors import Params


def _shares(weights: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    shares = weights / weights.sum()
    return shares.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def weighted_mean(deltas: Params, weights: torch.Tensor) -> Params:
    """FedAvg: ``sum_n (s_n / sum s) d_n`` with ``s_n`` the clients' sample counts.

    One matrix-vector product per parameter: a single pass over the stacked updates, no (C, ...) temporary.
    """
    shares = weights / weights.sum()
    return {k: torch.tensordot(shares.to(d.dtype), d, dims=1) for k, d in deltas.items()}


def agreement_mask(deltas: Params, weights: torch.Tensor, tau: float) -> Params:
    """GMA's soft mask (Tenison et al. 2023, eq. 2-3): ``m_j = 1 if A_j >= tau else A_j``.

    ``A_j = |mean_n sign(D_n,j)|`` over the clients' weighted updates ``D_n = (s_n / sum s) d_n`` (the
    shares are positive, so the signs are those of ``d_n``). ``tau = 0`` gives a mask of ones.
    """
    out = {}
    for k, d in deltas.items():
        agreement = torch.sign(_shares(weights, d) * d).mean(0).abs()
        out[k] = torch.where(agreement >= tau, torch.ones_like(agreement), agreement)
    return out


def gradient_masked_mean(deltas: Params, weights: torch.Tensor, tau: float) -> Params:
    """GMA for FedAvg (Algorithm 1 of the GMA paper): ``m * sum_n D_n``; ``tau = 0`` is plain averaging."""
    mean, mask = weighted_mean(deltas, weights), agreement_mask(deltas, weights, tau)
    return {k: mask[k] * mean[k] for k in mean}


def no_mask(*_: object) -> None:
    """FedAvg's plain mean: no mask on the server's step."""
    return None


#: ``aggregator.name`` -> the mask on the server's step: ``(deltas, weights, tau) -> mask or None``
AGGREGATORS: Registry[Callable[[Params, torch.Tensor, float], Params | None]] = Registry("aggregator")
AGGREGATORS.register("mean", no_mask, about="FedAvg: the clients' updates averaged, weighted by their sample counts")
AGGREGATORS.register("gma", agreement_mask, about="gradient-masked averaging (Tenison et al. 2023): the mean update "
                     "times a sign-agreement mask (aggregator.tau)")


def aggregate(name: str, deltas: Params, weights: torch.Tensor, tau: float) -> tuple[Params, Params | None]:
    """The weighted mean update and the mask (``gma``; None for ``mean``) that multiplies the server's final step.

    The GMA paper (Algorithm 2) feeds the unmasked mean into adaptive servers (FedAdam/FedYogi moments)
    and masks the step they produce; for FedAvg this is the same as masking the mean.
    """
    return weighted_mean(deltas, weights), AGGREGATORS[name](deltas, weights, tau)
