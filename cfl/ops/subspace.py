"""Orthonormal layer-input bases: projection, GPM's energy threshold, basis extension.

Shared by GPM (Saha et al., ICLR 2021, arXiv 2103.09762) and FOT (Bakman et al., ICLR 2024, arXiv
2309.01289). A basis ``O`` (d x k, orthonormal columns) spans old tasks' inputs of one layer; an update
or gradient ``D`` of that layer's weight (out x d, or a conv weight (C_out, C_in, kh, kw) with
d = C_in * kh * kw) is made orthogonal to it: ``D <- D - (D O) O^T``, so ``(W + D) X = W X`` for every old
input ``X`` in span(O).
"""

from __future__ import annotations

import torch


def project_out(update: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``D - (D O) O^T`` on the im2col view ``D.reshape(out, d)`` (linear or conv), reshaped back.

    Zero columns of ``basis`` project nothing, so bases padded with zeros to a common width are fine.
    """
    flat = update.reshape(update.shape[0], -1)
    basis = basis.to(flat.dtype)
    return (flat - (flat @ basis) @ basis.T).reshape(update.shape)


def energy_target(eps: float, residual_ratio: float = 1.0) -> float:
    """The fraction of the *new* (residual) energy to keep so that old basis + new directions hold ``eps``.

    FOT/GPM: with ``r`` the residual share of the total energy, keep ``(eps - (1 - r)) / r``; ``r = 1``
    (no basis yet) gives ``eps``. Returns a value <= 0 when the old basis already holds ``eps``.
    """
    if residual_ratio <= 0.0:
        return 0.0
    return (eps - (1.0 - residual_ratio)) / residual_ratio


def energy_rank(svals: torch.Tensor, eps: float, residual_ratio: float = 1.0, at_least_one: bool = False) -> int:
    """Smallest k with ``sum_{j<=k} S_j^2 / sum_j S_j^2 >= energy_target(eps, r)``; 0 if the target is met.

    ``svals`` are singular values in descending order. ``at_least_one`` (the FOT reference code's habit)
    returns at least 1 whenever there is any energy.
    """
    energy = svals.double() ** 2
    total = float(energy.sum())
    if total <= 0.0:
        return 0
    target = energy_target(eps, residual_ratio)
    if target <= 0.0:
        return 1 if at_least_one else 0
    cumulative = torch.cumsum(energy, 0) / total
    k = int((cumulative < target - 1e-12).sum()) + 1
    return max(min(k, len(svals)), 1 if at_least_one else 0)


def extend_basis(basis: torch.Tensor | None, new: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """Orthonormal basis of ``[O, new]`` (float64), the old columns first: ``orth([O, new])``.

    ``new`` is made orthogonal to ``O`` (two Gram-Schmidt passes), then orthonormalised by QR; should a
    new column be (numerically) dependent, an SVD of the block keeps only the directions it really adds.
    """
    new = new.double()
    if basis is not None and basis.shape[1] > 0:
        old = basis.double().to(new.device)
        for _ in range(2):
            new = new - old @ (old.T @ new)
    else:
        old = new.new_zeros(new.shape[0], 0)
    if new.shape[1] == 0:
        return old
    q, r = torch.linalg.qr(new)
    if bool((r.diagonal().abs() > tol).all()):
        return torch.cat([old, q], 1)
    u, s, _ = torch.linalg.svd(new, full_matrices=False)
    return torch.cat([old, u[:, s > tol]], 1)


def residual(inputs: torch.Tensor, basis: torch.Tensor | None) -> torch.Tensor:
    """``A - O O^T A``: the part of the input columns not yet in span(O)."""
    if basis is None or basis.shape[1] == 0:
        return inputs
    basis = basis.to(inputs.dtype)
    return inputs - basis @ (basis.T @ inputs)


def gram_spectrum(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, S) of ``A`` from its Gram matrix ``A A^T``: eigenvectors and sqrt eigenvalues, descending."""
    evals, evecs = torch.linalg.eigh(gram.double())
    order = torch.argsort(evals, descending=True)
    return evecs[:, order], evals[order].clamp(min=0.0).sqrt()


def gram_residual_spectrum(gram: torch.Tensor, basis: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(U, S) of the residual ``R = A - O O^T A`` from ``A A^T`` (d x d, eigh of ``R R^T``) and
    ``r = ||R||^2 / ||A||^2``: GPM's (Saha et al. 2021) representation step, O(d^3)."""
    gram = gram.double()
    total = float(gram.trace())
    if basis is not None and basis.shape[1] > 0:
        outside = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device) - basis.double() @ basis.double().T
        gram = outside @ gram @ outside
    vectors, svals = gram_spectrum(gram)
    return vectors, svals, float(gram.trace()) / total if total > 0 else 0.0


def thin_residual_spectrum(inputs: torch.Tensor, basis: torch.Tensor | None, floor: float = 1e-6
                           ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """As :func:`gram_residual_spectrum` from ``A`` itself (d x n): eigh of the n x n ``R^T R = V S^2 V^T``,
    ``U = R V S^-1``, O(d n^2 + n^3): for ``n < d`` the same directions and energy criterion for less work.

    Directions with ``S_j <= floor * S_1`` (under ``floor^2`` of the top energy, where eigh's rounding of
    ``R^T R`` lies) are left out; those the ``d x d`` path would add there span noise.
    """
    inputs = inputs.double()
    rest = residual(inputs, None if basis is None else basis.double())
    total = float((inputs * inputs).sum())
    evals, evecs = torch.linalg.eigh(rest.T @ rest)
    order = torch.argsort(evals, descending=True)
    svals = evals[order].clamp(min=0.0).sqrt()
    live = svals > floor * svals[0]  # none when R = 0
    vectors = (rest @ evecs[:, order[live]]) / svals[live]
    return vectors, svals[live], float((rest * rest).sum()) / total if total > 0 else 0.0
