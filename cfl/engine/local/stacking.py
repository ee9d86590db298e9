"""One-client method data stacked over clients: (nested) states and replay samples, padded where ragged.

Method hooks see one client; the batched trainer runs them under ``torch.func.vmap`` over a stack of
clients, so the clients' states are stacked here leaf by leaf (a nested dict keeps its nesting). A client
without a leaf gets zeros of the leaf's shape; a leaf a method declares ragged (``Method.computes.ragged``) is
zero-padded along its dim to the widest client. Replay samples are padded to the client with the most,
with weight 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cfl.methods.hook_types import Samples
from cfl.tensors import State


@dataclass
class Batch:
    """Samples stacked over clients ``(C, B, ...)``: ``weight`` is 0 for padding samples; ``extra`` the named
    per-sample tensors of step draws (``samples``' step part) ``(C, B, ...)``, zero for padding."""

    x: torch.Tensor
    y: torch.Tensor
    task: torch.Tensor
    weight: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def _ragged_dim(path: str, ragged: dict[str, int]) -> int | None:
    for key, dim in ragged.items():
        if path == key or path.startswith(f"{key}."):
            return dim
    return None


def _stack_leaf(leaves: list[Any], dim: int | None) -> torch.Tensor:
    template = next(v for v in leaves if v is not None)
    if dim is not None:  # zero-pad to the widest client
        width = max(v.shape[dim] for v in leaves if v is not None)
        shape = list(template.shape)
        padded = []
        for v in leaves:
            shape[dim] = width
            out = template.new_zeros(shape)
            if v is not None:
                out.narrow(dim, 0, v.shape[dim]).copy_(v)
            padded.append(out)
        return torch.stack(padded)
    if all(v is not None for v in leaves):
        return torch.stack(leaves)
    return torch.stack([torch.zeros_like(template) if v is None else v for v in leaves])


def stack_states(states: list[State], ragged: dict[str, int], prefix: str = "") -> State:
    """The clients' states stacked leaf by leaf over a new leading client dim (tensor leaves only)."""
    keys: list[str] = []
    for s in states:
        keys += [k for k in s if k not in keys]
    out: State = {}
    for k in keys:
        leaves = [s.get(k) for s in states]
        first = next(v for v in leaves if v is not None)
        path = f"{prefix}{k}"
        if isinstance(first, dict):
            out[k] = stack_states([v or {} for v in leaves], ragged, f"{path}.")
        elif isinstance(first, torch.Tensor):
            out[k] = _stack_leaf(leaves, _ragged_dim(path, ragged))
    return out


def client_rows(stacked: State, n: int) -> State:
    """The first ``n`` clients of a stacked state."""
    return {k: client_rows(v, n) if isinstance(v, dict) else v[:n] for k, v in stacked.items()}


def pad_samples(samples: list[Samples | None]) -> Batch | None:
    """The clients' replay samples stacked ``(C, width, ...)``, padded with weight-0 zeros to the client with
    the most; None when no client has any."""
    real = [s for s in samples if s is not None]
    if not real:
        return None
    like = real[0]
    width, C = max(len(s.y) for s in real), len(samples)
    x = like.x.new_zeros((C, width, *like.x.shape[1:]))
    y = like.y.new_zeros((C, width))
    task = like.task.new_zeros((C, width))
    weight = torch.zeros(C, width, device=like.x.device)
    extra = {name: v.new_zeros((C, width, *v.shape[1:])) for name, v in like.extra.items()}
    for c, s in enumerate(samples):
        k = 0 if s is None else len(s.y)
        if k:
            x[c, :k], y[c, :k], task[c, :k], weight[c, :k] = s.x, s.y, s.task, 1.0
            if set(s.extra) != set(extra):
                raise ValueError(f"one client's samples carry the extras {sorted(like.extra)}, another's "
                                 f"{sorted(s.extra)}: every client's draw must name the same ones")
            for name, v in s.extra.items():
                extra[name][c, :k] = v
    return Batch(x, y, task, weight, extra)


def sample_counts(samples: list[Samples | None]) -> list[int]:
    """Each client's number of replay samples."""
    return [0 if s is None else len(s.y) for s in samples]


def couples_samples(model: nn.Module) -> bool:
    """Whether a sample's output depends on the other samples of its batch (BatchNorm on batch statistics):
    then no padding sample may reach the model, or a client's short batch is normalised with copies of one
    sample (e.g. Mini-ImageNet's last step of 2 real images in a batch of 16)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
