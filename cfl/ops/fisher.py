"""Diagonal Fisher information of a classifier on a set of samples, from per-sample gradients; and MAS's importance.

``F_i = mean_n E_c[(d/dw_i log p(c | x_n, w))^2]`` where the expectation over the label ``c`` is either
the observed label (``empirical`` Fisher: ``c = y_n``) or the model's own predictive distribution
(``true`` Fisher, computed exactly as ``sum_c p(c|x_n) g_{n,c}^2``, no label sampling). Per-sample
gradients come from ``torch.func`` (``vmap`` of ``grad``/``jacrev`` over samples, in chunks); networks
made only of linear layers (MLPs, heads) take the exact shortcut of :mod:`cfl.ops.fisher_linear` instead.
The model runs in eval mode (dropout off), so the Fisher is deterministic.

The same machinery gives MAS's importance (Aljundi et al. 2018, kind ``output-norm``): the mean over the
samples of ``|d ||f(x_n)||_2^2 / dw_i|``, the absolute per-sample gradient of the squared L2 norm of the logits
(the linear shortcut holds for absolute values too: ``|delta_n a_n^T| = |delta_n| |a_n|^T``).

A model whose forward couples the samples of a batch (BatchNorm with batch statistics only, as the
Mini-ImageNet ResNet) is trained as a function of whole mini-batches: each sample's logits depend on its
batch's statistics. Its Fisher is taken of that same function: the samples go through in consecutive
batches of the run's ``batch_size`` (stored order), and ``g_n`` is the gradient of sample n's
log-likelihood through the batch forward, statistics included (one Jacobian row per sample). Running the
samples one at a time instead would normalise each by its own statistics, a function never trained.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, jacrev, vmap

from cfl.ops.fisher_linear import linear_fisher_sum, linear_layers
from cfl.tensors import Params

#: per-sample gradients held at once, in floats (64 MiB in float32)
FLOAT_BUDGET = 1 << 24


#: samples per chunk of the linear-layer shortcut
LINEAR_CHUNK = 1024

#: the per-sample statistic of MAS: absolute gradients of the squared L2 norm of the output
OUTPUT_NORM = "output-norm"


def batch_coupled(model: nn.Module) -> bool:
    """Whether the model's forward mixes the samples of a batch (BatchNorm without running statistics)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats for m in model.modules())


def diagonal_fisher(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int,
                    kind: str = "empirical", allowed: torch.Tensor | None = None,
                    per_sample: bool = False, batch_size: int = 0) -> Params:
    """Diagonal Fisher at ``params`` over samples ``x`` (with labels ``y``, head ``task``); zeros if no samples.

    ``allowed`` (K,) bool restricts the softmax to those classes (class-incremental seen classes).
    ``per_sample`` forces the generic per-sample-gradient path (the linear shortcut's reference).
    ``batch_size``: the run's mini-batch size, required by batch-coupled models (see the module's notes).
    """
    if kind not in ("empirical", "true"):
        raise ValueError(f"Fisher kind must be 'empirical' or 'true', got {kind!r}")
    return _diagonal_statistic(model, params, x, y, task, kind, allowed, per_sample, batch_size)


def output_norm_importance(model: nn.Module, params: Params, x: torch.Tensor, task: int, per_sample: bool = False,
                           batch_size: int = 0) -> Params:
    """MAS importance at ``params``: ``mean_n |d ||f(x_n)||_2^2 / dw|`` over samples ``x`` with head ``task``
    (``f``: the logits the model returns), in eval mode; zeros if no samples. Arguments as :func:`diagonal_fisher`."""
    labels = torch.zeros(len(x), dtype=torch.long, device=x.device)  # unused by this statistic
    return _diagonal_statistic(model, params, x, labels, task, OUTPUT_NORM, None, per_sample, batch_size)


def _magnitude(kind: str, g: torch.Tensor) -> torch.Tensor:
    """What is averaged of a per-sample gradient: its square (Fisher) or its absolute value (MAS)."""
    return g.abs() if kind == OUTPUT_NORM else g.pow(2)


def _diagonal_statistic(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int, kind: str,
                        allowed: torch.Tensor | None, per_sample: bool, batch_size: int) -> Params:
    params = {k: v.detach() for k, v in params.items()}
    was_training = model.training
    model.eval()
    try:
        if batch_coupled(model):
            if batch_size < 1:
                raise ValueError("this model normalises with batch statistics: its Fisher (or MAS importance) needs "
                                 "the run's batch_size")
            return _batch_mode_fisher(model, params, x, y, task, kind, allowed, batch_size)
        layers = None if per_sample else linear_layers(model, set(params))
        if layers is not None:
            total = {k: torch.zeros_like(v) for k, v in params.items()}
            for start in range(0, len(x), LINEAR_CHUNK):
                part = linear_fisher_sum(model, layers, params, x[start : start + LINEAR_CHUNK],
                                         y[start : start + LINEAR_CHUNK], task, kind, allowed)
                if part is None:
                    break
                for k, v in part.items():
                    total[k] += v
            else:
                return {k: v / max(len(x), 1) for k, v in total.items()}
        return _per_sample_fisher(model, params, x, y, task, kind, allowed)
    finally:
        model.train(was_training)


def _per_sample_fisher(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int,
                       kind: str, allowed: torch.Tensor | None) -> Params:
    buffers = dict(model.named_buffers())

    def log_probs(p: Params, xi: torch.Tensor, ti: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, (p, buffers), (xi.unsqueeze(0), ti.unsqueeze(0)))[0]
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        return F.log_softmax(logits, dim=-1)

    def log_likelihood(p: Params, xi: torch.Tensor, yi: torch.Tensor, ti: torch.Tensor) -> torch.Tensor:
        return log_probs(p, xi, ti).gather(0, yi.unsqueeze(0)).squeeze(0)

    def output_norm(p: Params, xi: torch.Tensor, yi: torch.Tensor, ti: torch.Tensor) -> torch.Tensor:  # noqa: ARG001
        return functional_call(model, (p, buffers), (xi.unsqueeze(0), ti.unsqueeze(0)))[0].pow(2).sum()

    n_params = sum(v.numel() for v in params.values())
    fisher = {k: torch.zeros_like(v) for k, v in params.items()}
    if kind != "true":
        per_sample = vmap(grad(output_norm if kind == OUTPUT_NORM else log_likelihood), in_dims=(None, 0, 0, 0))
        chunk = max(1, FLOAT_BUDGET // n_params)
    else:
        per_class = vmap(jacrev(log_probs), in_dims=(None, 0, 0))
        with torch.no_grad():
            classes = functional_call(model, (params, buffers), (x[:1], y[:1] * 0 + task)).shape[-1] if len(x) else 1
        chunk = max(1, FLOAT_BUDGET // (n_params * classes))
    for start in range(0, len(x), chunk):
        xb, yb = x[start : start + chunk], y[start : start + chunk]
        tb = torch.full_like(yb, task)
        if kind != "true":
            grads = per_sample(params, xb, yb, tb)
            for k, g in grads.items():
                fisher[k] += _magnitude(kind, g).sum(0)
        else:
            jac = per_class(params, xb, tb)  # (B, K, *shape) per parameter
            with torch.no_grad():
                probs = vmap(log_probs, in_dims=(None, 0, 0))(params, xb, tb).exp()  # (B, K)
            for k, j in jac.items():
                weight = probs.view(*probs.shape, *([1] * (j.dim() - 2)))
                fisher[k] += torch.nan_to_num(weight * j.pow(2)).sum((0, 1))
    n = max(len(x), 1)
    return {k: v / n for k, v in fisher.items()}


def _batch_mode_fisher(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, task: int, kind: str,
                       allowed: torch.Tensor | None, batch_size: int) -> Params:
    """The Fisher (or MAS importance) of a batch-coupled model: per-sample gradients through each batch's forward."""
    buffers = dict(model.named_buffers())
    fisher = {k: torch.zeros_like(v) for k, v in params.items()}
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        tb = torch.full_like(yb, task)

        def outputs(p: Params, xb: torch.Tensor = xb, tb: torch.Tensor = tb) -> torch.Tensor:
            return functional_call(model, (p, buffers), (xb, tb))

        def log_probs(p: Params) -> torch.Tensor:
            logits = outputs(p)
            if allowed is not None:
                logits = logits.masked_fill(~allowed, float("-inf"))
            return F.log_softmax(logits, dim=-1)

        if kind != "true":
            if kind == OUTPUT_NORM:
                rows = jacrev(lambda p: outputs(p).pow(2).sum(1))(params)
            else:
                rows = jacrev(lambda p, yb=yb: log_probs(p).gather(1, yb.unsqueeze(1)).squeeze(1))(params)
            for k, g in rows.items():  # (B, *shape): sample n's gradient in row n
                fisher[k] += _magnitude(kind, g).sum(0)
            continue
        with torch.no_grad():
            probs = log_probs(params).exp()  # (B, K)
        for c in range(probs.shape[1]):
            rows = jacrev(lambda p, c=c: log_probs(p)[:, c])(params)
            for k, g in rows.items():
                weight = probs[:, c].view(-1, *([1] * (g.dim() - 1)))
                fisher[k] += torch.nan_to_num(weight * g.pow(2)).sum(0)
    n = max(len(x), 1)
    return {k: v / n for k, v in fisher.items()}
