"""Exact diagonal Fisher for networks whose parameters all sit in linear layers, without per-sample gradients.

For a linear layer ``z_n = W a_n + b`` the gradient of sample ``n`` is ``delta_n a_n^T`` with
``delta_n = d log p / d z_n``, so ``sum_n g_n^2 = (delta^2)^T (a^2)`` (elementwise squares): one matrix
product instead of ``n`` materialised gradients. ``delta`` comes from ONE backward pass of the summed
log-likelihood (samples are independent in eval mode). The true Fisher weights the backward of class
``c`` by ``sqrt(p_nc)``, so its squares carry ``p_nc`` (one backward per class). Per-task heads
(``MultiHead``) get the same product in the rows of each sample's own task. MAS's importance
(``output-norm``) is the same product of absolute values, ``sum_n |g_n| = |delta|^T |a|``, with ``delta``
from the backward of ``sum_n ||z_n||^2`` (``z``: the logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from cfl.heads import MultiHead
from cfl.tensors import Params


def linear_layers(model: nn.Module, names: set[str]) -> dict[str, nn.Module] | None:
    """``{module name: module}`` if every parameter in ``names`` belongs to a Linear or MultiHead, else None."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, MultiHead))}
    covered = {f"{n}.{p}" if n else p for n, m in layers.items() for p, _ in m.named_parameters(recurse=False)}
    return layers if names <= covered and covered <= names else None


def linear_fisher_sum(model: nn.Module, layers: dict[str, nn.Module], params: Params, x: torch.Tensor,
                      y: torch.Tensor, task: int, kind: str, allowed: torch.Tensor | None) -> Params | None:
    """``sum_n`` of squared per-sample gradients over this chunk (absolute ones for ``output-norm``); None if a
    layer input is not (B, features)."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(name: str):
        def hook(_module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            seen[name] = (inputs[0].detach(), output)
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    try:
        live = {k: v.detach().requires_grad_() for k, v in params.items()}
        tb = torch.full_like(y, task)
        logits = functional_call(model, live, (x, tb))
    finally:
        for h in handles:
            h.remove()
    if any(a.dim() != 2 for a, _ in seen.values()):
        return None
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp = F.log_softmax(logits, dim=-1)
    names = list(seen)
    outputs = [seen[n][1] for n in names]
    if kind == "output-norm":
        backwards = [logits.pow(2).sum()]
    elif kind == "empirical":
        backwards = [logp.gather(1, y.unsqueeze(1)).sum()]
    else:
        root_p = logp.detach().exp().sqrt()
        classes = range(logp.shape[1]) if allowed is None else allowed.nonzero().flatten().tolist()
        backwards = [(root_p[:, c] * logp[:, c]).sum() for c in classes]
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for i, objective in enumerate(backwards):
        deltas = torch.autograd.grad(objective, outputs, retain_graph=i < len(backwards) - 1)
        for name, delta in zip(names, deltas, strict=True):
            a2, d2 = (seen[name][0].abs(), delta.abs()) if kind == "output-norm" else (seen[name][0] ** 2, delta**2)
            module = layers[name]
            prefix = f"{name}." if name else ""
            if isinstance(module, MultiHead):
                total[f"{prefix}weight"][task] += d2.T @ a2
                if module.bias is not None:
                    total[f"{prefix}bias"][task] += d2.sum(0)
            else:
                total[f"{prefix}weight"] += d2.T @ a2
                if module.bias is not None:
                    total[f"{prefix}bias"] += d2.sum(0)
    return total
