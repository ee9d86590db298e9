"""Global Principal Subspace Extraction (FOT, Bakman et al., ICLR 2024, arXiv 2309.01289), as tensor maths.

Client n: residual inputs ``R_n = A_n - O O^T A_n`` of a layer, sketch ``Y_n = R_n G_n`` with its own
Gaussian ``G_n`` (n x m), and the energies ``||R_n||_F^2``, ``||A_n||_F^2``. Server: sums only
(``Y = sum_n Y_n``, ``r = sum ||R_n||^2 / sum ||A_n||^2``), SVD of ``Y``, GPM's energy criterion with the
residual ratio, ``O <- orth([O, U_k])``. Because ``sum_n R_n G_n = [R_1 .. R_N] [G_1; ..; G_N]`` the sum is a
Gaussian sketch of all clients' inputs together, whose left singular vectors approximate theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from cfl.ops.subspace import energy_rank, extend_basis, residual


def client_sketch(blocks: Iterable[Mapping[str, torch.Tensor]], basis: Mapping[str, torch.Tensor],
                  widths: Mapping[str, int], generator: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    """One client's GPSE upload from its input matrices, given chunk by chunk (``{layer: (d, n_chunk)}``).

    Returns per layer ``sketch`` (d x m, float32) and the scalars ``residual_energy``, ``total_energy``.
    The Gaussian rows are drawn from ``generator`` chunk by chunk and layer by layer, in that order.
    """
    sums: dict[str, list[torch.Tensor]] = {}
    for block in blocks:
        for name, inputs in block.items():
            rest = residual(inputs, basis.get(name))
            gaussian = torch.randn(inputs.shape[1], widths[name], generator=generator, dtype=inputs.dtype)
            parts = [(rest @ gaussian.to(inputs.device)).double(), (rest.double() ** 2).sum(),
                     (inputs.double() ** 2).sum()]
            sums[name] = [a + b for a, b in zip(sums[name], parts, strict=True)] if name in sums else parts
    return {name: {"sketch": y.float(), "residual_energy": res.float(), "total_energy": tot.float()}
            for name, (y, res, tot) in sums.items()}


@dataclass
class LayerExtension:
    """What one GPSE step did to one layer's basis."""

    basis: torch.Tensor  # (d, k) float32, old columns first
    added: int
    residual_ratio: float


def residual_ratio(residual_energies: list[float], total_energies: list[float], quirks: bool) -> float:
    """``sum ||R_n||^2 / sum ||A_n||^2``; with ``quirks`` the reference code's mean of ``||R_n|| / ||A_n||``."""
    if quirks:
        ratios = [(r / t) ** 0.5 for r, t in zip(residual_energies, total_energies, strict=True) if t > 0]
        return sum(ratios) / len(ratios) if ratios else 0.0
    total = sum(total_energies)
    return sum(residual_energies) / total if total > 0 else 0.0


def server_extend(payloads: Mapping[int, Mapping[str, torch.Tensor]], basis: torch.Tensor | None, eps: float,
                  quirks: bool = False) -> LayerExtension:
    """Sum one layer's client payloads (in client-id order), SVD, threshold, extend ``basis``."""
    cids = sorted(payloads)
    sketch = sum(payloads[c]["sketch"].double() for c in cids)
    ratio = residual_ratio([float(payloads[c]["residual_energy"]) for c in cids],
                           [float(payloads[c]["total_energy"]) for c in cids], quirks)
    d = sketch.shape[0]
    have = 0 if basis is None else basis.shape[1]
    u, s, _ = torch.linalg.svd(sketch, full_matrices=False)
    k = min(energy_rank(s, eps, ratio, at_least_one=quirks), d - have)
    extended = extend_basis(basis, u[:, :k]).float()
    return LayerExtension(extended, extended.shape[1] - have, ratio)
