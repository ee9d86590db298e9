"""BatchNorm-statistics matching, the image prior of data-free synthesis (DeepInversion, Yin et al. CVPR 2020),
as TARGET (Zhang et al., ICCV 2023) and MFCL (Babakniya et al., NeurIPS 2023) use it against a frozen teacher.

While :func:`recording_batch_statistics` is open, a forward hook on every BatchNorm layer that keeps running
statistics records the per-channel mean and biased variance of the layer's INPUT in the current forward (the
statistics the synthetic batch has) beside the layer's running mean and variance (what the real data had).
Two ways to compare them, each its official code's:

- TARGET, :func:`l2_statistics_loss`: ``sum over layers of ||var_run - var|| + ||mean_run - mean||`` (Euclidean
  norms, not squared), optionally against a momentum blend of the earlier batches' statistics.
- MFCL, :func:`gaussian_statistics_loss`: per layer the KL divergence of the per-channel Gaussians
  ``KL(N(mean_run, var_run) || N(mean, var))`` averaged over channels, then averaged over layers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: MFCL's code adds this to the batch variance and to the running variance before comparing them
GAUSSIAN_EPS = 1e-8


@dataclass
class LayerStatistics:
    """One BatchNorm layer in one forward: the input's per-channel ``mean`` and biased ``var`` (with gradient),
    and the layer's running statistics (detached)."""

    name: str
    mean: torch.Tensor
    var: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor


def running_stat_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's BatchNorm layers that keep running statistics, in module order; none is refused."""
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, _BATCH_NORMS) and m.track_running_stats]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no BatchNorm layer with running statistics, which "
                         "BatchNorm-statistics matching compares the synthetic batch with; use a model variant "
                         "with running-stat BatchNorm")
    return layers


def channel_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance of ``x`` ``(N, C, ...)``, over every dim but the channel (dim 1)."""
    dims = [0, *range(2, x.dim())]
    return x.mean(dims), x.var(dims, unbiased=False)


@contextmanager
def recording_batch_statistics(model: nn.Module) -> Iterator[list[LayerStatistics]]:
    """Inside the block, each forward of ``model`` appends one :class:`LayerStatistics` per running-stat
    BatchNorm layer to the yielded list (clear it between forwards); the hooks are removed on exit. The layers
    must be in eval mode: in training mode the forward would first move the running statistics toward the
    synthetic batch (refused)."""
    recorded: list[LayerStatistics] = []

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
            if module.training:
                raise ValueError(f"BatchNorm layer {name!r} is in training mode: its running statistics just moved "
                                 "toward the batch they are compared with; put the teacher in eval mode")
            mean, var = channel_statistics(inputs[0])
            recorded.append(LayerStatistics(name, mean, var, module.running_mean.detach(),
                                            module.running_var.detach()))
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in running_stat_layers(model)]
    try:
        yield recorded
    finally:
        for h in handles:
            h.remove()


def l2_statistics_loss(layers: list[LayerStatistics], momentum: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                       rate: float = 0.0) -> torch.Tensor:
    """TARGET's (and DeepInversion's) ``sum_l ||var_run - v_l||_2 + ||mean_run - m_l||_2``, where ``(m_l, v_l)``
    is the batch's statistics, or with ``momentum`` (per layer ``(mean, var)`` of earlier batches) the blend
    ``(1 - rate) * batch + rate * momentum`` (the official code's ``bn_mmt``)."""
    total = layers[0].mean.new_zeros(())
    for i, s in enumerate(layers):
        mean, var = s.mean, s.var
        if momentum is not None:
            mean = (1 - rate) * mean + rate * momentum[i][0]
            var = (1 - rate) * var + rate * momentum[i][1]
        total = total + torch.linalg.vector_norm(s.running_var - var) + torch.linalg.vector_norm(s.running_mean - mean)
    return total


def update_momentum(layers: list[LayerStatistics], momentum: list[tuple[torch.Tensor, torch.Tensor]] | None,
                    rate: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The momentum statistics after a synthesis: the last batch's on the first call, else
    ``rate * momentum + (1 - rate) * batch`` (detached)."""
    if momentum is None:
        return [(s.mean.detach(), s.var.detach()) for s in layers]
    return [(rate * m + (1 - rate) * s.mean.detach(), rate * v + (1 - rate) * s.var.detach())
            for s, (m, v) in zip(layers, momentum, strict=True)]


def gaussian_statistics_loss(layers: list[LayerStatistics]) -> torch.Tensor:
    """MFCL's per layer ``mean_c [log(sigma_c / sigma_run_c) - 1/2 (1 - (var_run_c + (mean_run_c - mean_c)^2) /
    var_c)]``, the channel-mean of ``KL(N(mean_run, var_run) || N(mean, var))``, averaged over the layers
    (the code adds 1e-8 to both variances)."""
    total = layers[0].mean.new_zeros(())
    for s in layers:
        var = s.var + GAUSSIAN_EPS
        run_var = s.running_var.to(var.dtype) + GAUSSIAN_EPS
        log_ratio = 0.5 * torch.log(var / run_var)
        total = total + (log_ratio - 0.5 * (1 - (run_var + (s.running_mean - s.mean) ** 2) / var)).mean()
    return total / len(layers)
