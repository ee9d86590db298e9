"""Train all sampled clients at once, on one of two paths sharing one round setup
(:mod:`cfl.engine.local.batched_round`): the stacked path (:mod:`cfl.engine.local.stacked`: stacked parameters trained
in place by fused steps) and the vmap path (:mod:`cfl.engine.local.vmap`: ``torch.func.vmap`` over one-client
code), as :func:`cfl.engine.local.path.choose_path` decides.

Each client keeps its own data order, step count and (per-client-seeded) replay draws, so results
match the sequential trainer up to float rounding (dropout masks and augmentation aside: both draw from
torch's global generator, in a different order). Clients train sorted by step count, so the clients still
training at a step are a prefix of the stack; a short batch (a client's last of an epoch) is padded with
weight-0 copies of its first sample, and replay samples are padded to the client with the most. On a model
whose layers mix samples (BatchNorm on batch statistics: :func:`cfl.engine.local.stacking.couples_samples`) padding
would enter the statistics, so there each step instead groups its clients by real batch and replay sizes and
runs every group unpadded (:func:`cfl.engine.local.vmap_losses.size_groups`).

The parameter update is the memory-bound part of a step (the stacked parameters are read and written
once per step); see :class:`cfl.engine.local.vmap_optim.SGDStep` and ``docs/performance.md``.
"""

from __future__ import annotations

import torch
from torch import nn

from cfl.engine.local.heap import retain_freed_memory
from cfl.engine.local.jobs import ClientJob, ClientOutcome, Hyper, RoundMethods
from cfl.engine.local.path import choose_path
from cfl.engine.local.precision import warn_if_slow
from cfl.engine.local.stacked import train_stacked
from cfl.engine.local.vmap import train_vmap
from cfl.tensors import Params


def train_batched(model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                  y: torch.Tensor, task: int, hp: Hyper, round_methods: RoundMethods,
                  workspace: Params | None = None) -> tuple[Params, list[ClientOutcome]]:
    """Run local SGD for every job at once; returns parameters stacked over clients (C, ...).

    Clients run sorted by their number of steps (most first), so the clients still training at step ``s``
    are a prefix of the stack and a step touches only that prefix (views, no copies): ragged client sizes
    cost no padded compute. They train in blocks of ``hp.client_block`` (:func:`auto_client_block` when 0),
    one block after another. ``workspace`` (a dict the caller keeps, e.g. :class:`BatchedTrainer`): the
    stacked path trains in these buffers and returns them, so the result is valid until the next call
    with the same workspace.
    """
    warn_if_slow(hp.precision, x.device)
    # the run's path is sequential then (cfl/engine/local/path.py)
    if round_methods.starts is not None or round_methods.frozen:
        raise ValueError("train_batched starts every client from the global model and moves every parameter: "
                         "parameters kept per client or frozen ones train with train_sequential")
    order = sorted(range(len(jobs)), key=lambda c: -len(jobs[c].indices))  # stable: ties keep job order
    ordered = [jobs[c] for c in order]
    block = hp.client_block or auto_client_block(model, x.device, len(jobs))
    path = hp.path or choose_path(model, hp, round_methods.methods).path
    if path == "stacked":
        params, outcomes = train_stacked(model, global_params, ordered, x, y, task, hp, round_methods, block, workspace)
    else:
        params, outcomes = train_vmap(model, global_params, ordered, x, y, task, hp, round_methods, block)
    if order == list(range(len(jobs))):
        return params, outcomes
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(len(order))
    back_list = back.tolist()
    back = back.to(x.device)
    return {k: v.index_select(0, back) for k, v in params.items()}, [outcomes[i] for i in back_list]


def auto_client_block(model: nn.Module, device: torch.device, clients: int) -> int:
    """Clients trained together when the config leaves it to the engine: all of them, except for
    convolutional nets on CPU, which train one client at a time. There the stacked activations of all
    clients (the AlexNet-like net: ~10 MB per client at batch 16) and their fully connected weights (25 MB
    per client) overflow the caches, and a grouped convolution is no faster than one client's: a Split
    CIFAR-100 round of 25 clients took 19-21 s in one block against 15-16 s one client at a time
    (``docs/performance.md``). A pretrained ViT counts as convolutional (its patch embedding): on CPU its
    clients train one at a time too, which bounds the activations a step holds to one client's (a ViT-B/16
    at 224 px: ~48 MB a sample); :func:`client_block_line` says so."""
    if device.type == "cpu" and any(isinstance(m, nn.Conv2d) for m in model.modules()):
        return 1
    return max(clients, 1)


def client_block_line(model: nn.Module, device: torch.device, clients: int, configured: int) -> str | None:
    """The line a run prints when the engine's own choice trains its ``clients`` one at a time, else None."""
    if configured or clients < 2 or auto_client_block(model, device, clients) != 1:
        return None
    return (f"engine: the {clients} clients of a round train one at a time (client_block 0: on {device.type} a "
            "model with a convolution trains per client, docs/performance.md); set client_block: N to train N "
            "together")


class BatchedTrainer:
    """:func:`train_batched` with one workspace kept across calls: what the round engine uses, since it
    consumes each round's client models before the next round starts."""

    def __init__(self) -> None:
        self.workspace: Params = {}
        retain_freed_memory()

    def __call__(self, model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                 y: torch.Tensor, task: int, hp: Hyper,
                 round_methods: RoundMethods) -> tuple[Params, list[ClientOutcome]]:
        return train_batched(model, global_params, jobs, x, y, task, hp, round_methods, self.workspace)
