"""The batched trainer's ``vmap``-ed forward per client group: plain, or carrying each client's BatchNorm running
statistics (``model.buffers``, docs/concepts.md) in and out of the forward."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from cfl.engine.local.jobs import Hyper
from cfl.engine.local.precision import autocast, to_float
from cfl.tensors import Params


def plain_forward(batched: Callable) -> Callable:
    """The ``vmap``-ed forward ``(params, x, task) -> logits`` of a model without running statistics, taking (and
    ignoring) the group's client indices like :func:`buffered_forward`."""
    return lambda p, xb, tb, idx=None: batched(p, xb, tb)  # noqa: ARG005


def buffered_forward(model: nn.Module, hp: Hyper, device: torch.device, buffers: Params) -> Callable:
    """The ``vmap``-ed forward of a model with BatchNorm running statistics: each client's forward runs on a copy of
    its own row of ``buffers`` (stacked ``(C, ...)``), which the forward updates (training mode) and which is
    written back into ``buffers`` at the group's client indices (None: the first n clients, those training)."""
    def forward(p: Params, b: Params, xb: torch.Tensor, tb: torch.Tensor) -> tuple[torch.Tensor, Params]:
        b = {k: v.clone() for k, v in b.items()}  # functional_call updates these in place
        with autocast(hp.precision, device):
            return to_float(functional_call(model, (p, b), (xb, tb))), b

    batched = vmap(forward, randomness="different")

    def run(p: Params, xb: torch.Tensor, tb: torch.Tensor, idx: torch.Tensor | None = None) -> torch.Tensor:
        n = xb.shape[0]
        rows = {k: v[:n] if idx is None else v.index_select(0, idx) for k, v in buffers.items()}
        logits, updated = batched(p, rows, xb, tb)
        with torch.no_grad():
            for k, v in updated.items():
                if idx is None:
                    buffers[k][:n].copy_(v)
                else:
                    buffers[k].index_copy_(0, idx, v)
        return logits

    return run
