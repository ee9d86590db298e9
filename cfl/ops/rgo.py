"""Recursive Gradient Optimization (Liu & Liu, ICLR 2022, arXiv 2201.12522) as tensor maths, one layer at a time.

Per protected layer, ``G`` is the Gram of the layer inputs of finished tasks (d x d; conv layers in the im2col
layout of GPM and FOT, :mod:`cfl.ops.layer_inputs`). The paper's recursive least-squares update over input
columns ``x``, ``k = P x / (alpha + x^T P x); P <- P - k x^T P`` from ``P = I``, gives
``P = alpha (alpha I + G)^-1`` (Sherman-Morrison), and the gradient of a weight (out x d) is preconditioned by
the trace-normalised ``P~ = d P / trace(P) = d (alpha I + G)^-1 / trace((alpha I + G)^-1)``: ``Gr <- Gr P~``.

A client keeps the deflation ``D = I - P = G (alpha I + G)^-1`` rather than ``P``: a client without finished
tasks (or a zero-padded slot of a stack of clients) holds ``D = 0``, which is the identity preconditioner.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import nn

from cfl.ops.layer_inputs import HeldInputs, iter_layer_inputs, layer_inputs_or_grams
from cfl.tensors import Params

GramNorm = Literal["sum", "mean"]
#: mixed into the FEL permutation seeds so they never coincide with another stream derived from the run seed
_FEL_TAG = 0x46454C


def task_inputs(model: nn.Module, params: Params, x: torch.Tensor, task: int, protected: dict[str, str],
                gram: GramNorm = "sum", chunk: int = 256) -> dict[str, HeldInputs]:
    """One task's layer inputs at ``params`` as GPM+FL collects them (float64): ``A`` itself while it has fewer
    columns than d, else ``A A^T``. ``gram="mean"`` scales them to the Gram ``A A^T / n`` (``A / sqrt(n)``), n the
    column count (samples, times output positions for a conv layer), so the Gram's scale does not grow with
    the data."""
    held = layer_inputs_or_grams(model, params, x, task, protected, chunk)
    if gram == "sum" or not held:
        return held
    per_sample = {n: a.shape[1] for n, a in next(iter_layer_inputs(model, params, x[:1], task, protected)).items()}
    scaled = {}
    for name, inputs in held.items():
        columns = len(x) * per_sample[name]
        scale = 1.0 / columns if inputs.is_gram else columns ** -0.5
        scaled[name] = HeldInputs(inputs.matrix * scale, inputs.is_gram)
    return scaled


def closed_form(gram: torch.Tensor, alpha: float) -> torch.Tensor:
    """``P = alpha (alpha I + G)^-1`` in float64. ``alpha I + G`` has condition number up to
    ``1 + lambda_max(G) / alpha`` (1e8 and more for a summed Gram and a small alpha): float32 would lose
    the small eigenvalues of ``P``, which are the ones that keep old inputs' outputs fixed."""
    gram = gram.double()
    eye = torch.eye(gram.shape[0], dtype=torch.float64, device=gram.device)
    return alpha * torch.cholesky_inverse(torch.linalg.cholesky(alpha * eye + gram))


def trace_normalised(p: torch.Tensor) -> torch.Tensor:
    """``d P / trace(P)``: trace ``d``, as the identity, so one learning rate serves every task."""
    return p * (p.shape[0] / torch.trace(p))


def preconditioner(gram: torch.Tensor, alpha: float) -> torch.Tensor:
    """``P~ = d (alpha I + G)^-1 / trace((alpha I + G)^-1)`` (float64)."""
    return trace_normalised(closed_form(gram, alpha))


def rls_step(p: torch.Tensor, x: torch.Tensor, alpha: float) -> torch.Tensor:
    """The paper's recursion for one input column ``x`` (d,): ``k = P x / (alpha + x^T P x); P - k x^T P``."""
    px = p @ x
    k = px / (alpha + x @ px)
    return p - torch.outer(k, x @ p)


def rls(columns: torch.Tensor, alpha: float, p: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`rls_step` over the columns of ``columns`` (d x n) in order, from ``p`` (default ``I``)."""
    p = torch.eye(columns.shape[0], dtype=columns.dtype) if p is None else p
    for x in columns.T:
        p = rls_step(p, x, alpha)
    return p


def absorb(deflation: torch.Tensor, gram: torch.Tensor, alpha: float) -> torch.Tensor:
    """The deflation ``D = I - P`` after a task whose inputs have the Gram ``gram``, in float64.

    ``alpha (alpha I + G_old + G)^-1 = (P^-1 + G / alpha)^-1 = (I + P G / alpha)^-1 P``: one linear solve,
    with the old ``P`` only (the old Gram is not kept); the same as the recursion over the task's columns."""
    p = torch.eye(gram.shape[0], dtype=torch.float64, device=gram.device) - deflation.double()
    eye = torch.eye(gram.shape[0], dtype=torch.float64, device=gram.device)
    new = torch.linalg.solve(eye + p @ gram.double() / alpha, p)
    return eye - (new + new.T) / 2


def absorb_columns(deflation: torch.Tensor, inputs: torch.Tensor, alpha: float) -> torch.Tensor:
    """:func:`absorb` from the task's input columns ``A`` (d x n) themselves, for ``n < d`` (a client with few
    samples): ``P_new = P - P A (alpha I + A^T P A)^-1 A^T P`` (Woodbury), O(d^2 n + n^3) instead of O(d^3)."""
    inputs = inputs.double()
    deflation = deflation.double()
    pa = inputs - deflation @ inputs  # P A with P = I - D
    inner = alpha * torch.eye(inputs.shape[1], dtype=torch.float64, device=inputs.device) + inputs.T @ pa
    added = pa @ torch.linalg.solve(inner, pa.T)  # LU, not Cholesky: a float32-stored P may be a hair indefinite
    return deflation + (added + added.T) / 2


def absorb_held(deflation: torch.Tensor, held: HeldInputs, alpha: float) -> torch.Tensor:
    """:func:`absorb` or :func:`absorb_columns`, as the client holds the task's inputs."""
    return (absorb if held.is_gram else absorb_columns)(deflation, held.matrix, alpha)


def precondition(grad: torch.Tensor, deflation: torch.Tensor) -> torch.Tensor:
    """``Gr P~`` on the view ``grad.reshape(out, d)`` (a linear weight, or a conv weight (C_out, C_in, kh, kw)
    with d = C_in kh kw), from the deflation ``D``: ``(Gr - Gr D) d / (d - trace(D))``, reshaped back."""
    flat = grad.reshape(grad.shape[0], -1)
    d = flat.shape[1]
    deflation = deflation.to(flat.dtype)
    return ((flat - flat @ deflation) * (d / (d - deflation.diagonal().sum()))).reshape(grad.shape)


def preconditioner_of(deflation: torch.Tensor) -> torch.Tensor:
    """``P~ = d P / trace(P)`` with ``P = I - D`` from the deflation ``D`` (d x d): the matrix ``g <- g P~`` applies
    (:func:`precondition` in one product)."""
    d = deflation.shape[0]
    p = torch.eye(d, dtype=deflation.dtype, device=deflation.device) - deflation
    return p * (d / (d - deflation.diagonal().sum()))


def precondition_inputs(inputs: torch.Tensor, deflation: torch.Tensor) -> torch.Tensor:
    """``X P~`` for layer inputs ``X`` (n x d): since ``Gr = delta^T X``, ``delta^T (X P~) = Gr P~``, at
    ``n d^2`` multiplications instead of ``out d^2`` (fewer where the batch is smaller than the layer)."""
    return precondition(inputs, deflation)


def fel_permutations(seed: int, task: int, widths: dict[str, int]) -> dict[str, torch.Tensor]:
    """FEL's fixed unit permutation of each layer for ``task``: a function of the run seed and the task only
    (identical on every client and every call), drawn layer by layer in the order of ``widths``."""
    state = np.random.SeedSequence([int(seed), int(task), _FEL_TAG]).generate_state(1, dtype=np.uint64)[0]
    generator = torch.Generator().manual_seed(int(state >> 1))
    return {name: torch.randperm(width, generator=generator) for name, width in widths.items()}
