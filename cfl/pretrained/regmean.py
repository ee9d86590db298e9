"""RegMean merging of linear layers (Jin et al., ICLR 2023, "Dataless Knowledge Fusion by Merging Weights of
Language Models") and its LoRA form (Salami et al., ICLR 2025, LoRM): the merged weight of a linear map trained by
several clients is the one that best reproduces every client's outputs on that client's inputs,

    W* = argmin_W sum_i ||W X_i^T - W_i X_i^T||^2 = (sum_i W_i G_i) (sum_i G_i)^+,   G_i = X_i^T X_i,

so a client sends its weight and the Gram matrix of the layer's inputs, and the server solves in float64. For a
LoRA update ``B A`` with one factor shared (frozen during the round), the other factor's merge is the same
problem: ``A`` trained (``B`` shared) merges as a linear layer on the inputs ``X`` (the official code's choice:
``A = (sum A_i G_i)(sum G_i)^+``); ``B`` trained (``A`` shared) merges as a linear layer on the projected inputs
``X A^T``, whose Gram is ``A G_i A^T`` (r x r): ``B = (sum B_i A G_i A^T)(sum A G_i A^T)^+``, the exact
minimiser of ``sum_i ||B A X_i^T - B_i A X_i^T||^2``."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def shrunk(gram: torch.Tensor, alpha: float) -> torch.Tensor:
    """RegMean's regularised Gram ``alpha G + (1 - alpha) diag(G)``: the off-diagonal entries scaled by ``alpha``
    (1: the plain Gram; the official code's ``alpha_regmean``, 0.5)."""
    return alpha * gram + (1 - alpha) * torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))


def regmean(weights: Sequence[torch.Tensor], grams: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(sum_i W_i G_i)(sum_i G_i)^+`` in float64: client ``i``'s weight ``(..., out, in)`` (extra leading dims, e.g.
    a head per task, share its Gram) and Gram ``(in, in)``; a sequence or a tensor stacked over the clients. The
    sums run one client at a time (no stacked float64 copy of every client's Gram)."""
    numerator, total = None, None
    for w, g in zip(weights, grams, strict=True):
        g64 = g.to(torch.float64)
        term = w.to(torch.float64) @ g64
        numerator = term if numerator is None else numerator + term
        total = g64 if total is None else total + g64
    if numerator is None or total is None:
        raise ValueError("regmean needs at least one client's weight and Gram")
    return numerator @ torch.linalg.pinv(total, hermitian=True)


def projected_gram(gram: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The Gram of the inputs ``X A^T`` of a LoRA ``B`` factor: ``A G A^T`` (r x r), in float64."""
    a64 = a.to(torch.float64)
    return a64 @ gram.to(torch.float64) @ a64.T
