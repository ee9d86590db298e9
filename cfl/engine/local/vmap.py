"""The batched trainer's vmap path: autograd under ``torch.func.vmap`` over one-client code, for every model and
method the batched trainer takes (step hooks, gradient projections, per-sample and extra losses, BatchNorm
running statistics). A step's loss is :mod:`cfl.engine.local.vmap_losses`', its update
:mod:`cfl.engine.local.vmap_optim`'s; the sequential trainer is the oracle it is tested against
(``tests/engine/test_batched_equals_sequential.py``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vmap

from cfl.engine.local import hooks
from cfl.engine.local.batched_forward import buffered_forward, plain_forward
from cfl.engine.local.batched_round import BatchedRound, client_blocks, prefix_rows, stacked_buffers, with_replay
from cfl.engine.local.batched_steps import (
    carry_on,
    drawn_samples,
    leaf_row,
    loss_samples,
    preconditioners_of,
    rewritten,
)
from cfl.engine.local.jobs import ClientJob, ClientOutcome, Hyper, RoundMethods
from cfl.engine.local.precision import autocast, to_float
from cfl.engine.local.stacking import client_rows, couples_samples, sample_counts
from cfl.engine.local.step_hooks import StepStage, step_key
from cfl.engine.local.vmap_losses import grouped_losses, size_groups
from cfl.engine.local.vmap_optim import OptimStep, SGDStep
from cfl.methods.declarations import gives
from cfl.tensors import Params


def train_vmap(model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor, y: torch.Tensor,
               task: int, hp: Hyper, round_methods: RoundMethods, block: int) -> tuple[Params, list[ClientOutcome]]:
    """Train the sorted ``jobs`` in blocks of ``block`` clients, each from its own copy of the global parameters;
    the blocks' parameters come back concatenated ``(C, ...)``."""
    parts, outcomes = [], []
    for _, chunk in client_blocks(jobs, block):
        params = {k: _stacked_leaf(v, len(chunk)) for k, v in global_params.items()}
        trained, block_outcomes = _train_block(model, global_params, params, chunk, x, y, task, hp, round_methods,
                                               stacked_buffers(chunk))
        parts.append(trained)
        outcomes += block_outcomes
    return parts[0] if len(parts) == 1 else {k: torch.cat([p[k] for p in parts]) for k in parts[0]}, outcomes


def _train_block(model: nn.Module, global_params: Params, params: Params, jobs: list[ClientJob], x: torch.Tensor,
                 y: torch.Tensor, task: int, hp: Hyper, round_methods: RoundMethods,
                 client_buffers: Params) -> tuple[Params, list[ClientOutcome]]:
    """One block's round from the stacked ``params``. ``client_buffers``: the clients' BatchNorm running statistics
    stacked ``(C, ...)`` (``{}`` without any), updated by their forwards and returned in the outcomes."""
    device = x.device
    C = len(jobs)
    buffers = dict(model.named_buffers())
    r = BatchedRound.of(global_params, jobs, x, y, task, hp, round_methods, None)
    coupled = couples_samples(model)
    stage = StepStage.of(round_methods.methods, round_methods.broadcasts, global_params, hp.lr, model, hp.precision,
                         device)
    starts = [stage.start([st[c] for st in r.raw_states]) for c in range(C)] if stage else []
    carry = stage.stacked(starts) if stage else {}
    keys = torch.stack([step_key(job, device) for job in jobs]) if stage else None
    update = (SGDStep if hp.optimizer == "sgd" else OptimStep)(hp, params, round_methods, stage is not None)
    if r.kept is not None:
        update.keep(r.kept[0])
    # layer preconditioners (RGO), once per round: (C or 1, d, d) per weight, the methods' products in order
    matrices = preconditioners_of(round_methods, global_params, r.states)
    loss_sum = torch.zeros(C, device=device)
    finite = torch.ones(C, dtype=torch.bool, device=device)

    def forward(p: Params, xb: torch.Tensor, tb: torch.Tensor) -> torch.Tensor:
        with autocast(hp.precision, device):  # bf16-mixed: products in bfloat16, the loss on float32 logits
            return to_float(functional_call(model, (p, buffers), (xb, tb)))

    batched_forward = buffered_forward(model, hp, device, client_buffers) if client_buffers else \
        plain_forward(vmap(forward, randomness="different"))
    model.train()
    full_params = params
    for s in range(r.steps):
        step = r.step(s)
        n = step.n
        params = full_params if n == C else {k: v[:n] for k, v in full_params.items()}
        step_states = r.states if n == C else [client_rows(st, n) for st in r.states]
        step_raw = [st[:n] for st in r.raw_states]
        # the step hooks' draws, after replay's and before the loss (``loss``'s extra part may take them)
        counts, drawn = drawn_samples(stage, n, step_raw, r.generators, x, carry, starts) if stage is not None \
            else ({}, {})
        step_allowed = None if r.allowed is None else r.allowed[:n]
        step_matrices = prefix_rows(matrices, n)
        to_loss = loss_samples(round_methods.methods, counts, drawn)
        groups = size_groups(r.sizes[:n, s], [sample_counts(d) for d in step.draws] + [c for c, _ in to_loss.values()],
                             hp.batch_size, coupled, device)
        cross_entropy, per_client = grouped_losses(groups, step.data, step.extras, params, step_allowed, step_states,
                                                   batched_forward, round_methods,
                                                   {i: b for i, (_, b) in to_loss.items()})
        loss_sum[:n] += cross_entropy.detach()
        for i, m in enumerate(round_methods.methods):
            if gives(m, "penalty"):
                broadcast = round_methods.broadcasts[i]
                pen = vmap(lambda p, st, m=m, b=broadcast: hooks.penalty_loss(m, p, global_params, b, st),
                           randomness="different")(params, step_states[i])
                per_client = per_client + pen
        finite[:n] &= torch.isfinite(per_client.detach())
        grads = torch.autograd.grad(per_client.sum() * update.loss_scale, list(params.values()))
        with torch.no_grad():
            if s == 0 and n == C:
                params = full_params = _match_grad_layout(params, grads)
            grads = dict(zip(params, grads, strict=True))
            if stage is not None:  # the step hooks: after the loss gradient, before the optimiser
                step_data = with_replay(step.data, step.extras), step_raw, step_states
                grads, before = rewritten(stage, s, n, params, grads, drawn, carry, step_data, keys)
            grads = {k: hooks.precondition(g, step_matrices[k]) if k in step_matrices else g for k, g in grads.items()}
            # SGD's decay adds into the gradients in place: carry_step must see the gradient before it
            carrying = stage is not None and bool(stage.carry_stepping)
            update(s if r.kept is None else r.kept[1][:n] + s, params,
                   {k: g.clone() for k, g in grads.items()} if carrying else grads, None, step_states, round_methods)
            if carrying:
                carry_on(stage, s, n, params, grads, before, drawn, carry, step_data, keys)
    carries = [{i: leaf_row(ci, c, starts[c][i]) for i, ci in carry.items()} for c in range(C)]
    outcomes = r.outcomes(loss_sum, finite, carries if carry else None,
                          None if r.kept is None else update.kept_slots(), client_buffers)
    return {k: v.detach().contiguous() for k, v in full_params.items()}, outcomes


# ``vmap`` over ``F.linear`` returns the weight gradient as a transposed view of a contiguous (C, in, out)
# tensor; an update that reads it against (C, out, in) parameters runs ~3x slower (strided reads), so after
# the first step of each round the parameters take the gradients' layout. It is relearnt every round (one
# copy), never carried between rounds, so a round's numbers do not depend on earlier rounds in the process
# and a resumed run matches an uninterrupted one bit for bit.
def _empty_in_order(shape: torch.Size | tuple[int, ...], order: list[int], like: torch.Tensor) -> torch.Tensor:
    """An empty tensor of ``shape`` whose dims lie in memory in ``order`` (outermost first)."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d], step = step, step * shape[d]
    return torch.empty_strided(tuple(shape), strides, dtype=like.dtype, device=like.device)


def _stacked_leaf(v: torch.Tensor, C: int) -> torch.Tensor:
    """``v`` repeated over a leading client dim, contiguous (``empty`` + ``copy_``: faster than ``repeat``)."""
    v = v.detach()
    return torch.empty((C, *v.shape), dtype=v.dtype, device=v.device).copy_(v.expand(C, *v.shape)).requires_grad_()


def _match_grad_layout(params: Params, grads: tuple[torch.Tensor, ...]) -> Params:
    """Re-store parameters whose gradient has another dense memory order."""
    out = {}
    for (k, p), g in zip(params.items(), grads, strict=True):
        order = sorted(range(g.dim()), key=lambda d: -g.stride(d))
        if g.dim() > 1 and order[0] == 0 and g.permute(order).is_contiguous() and g.stride() != p.stride():
            p = _empty_in_order(p.shape, order, p).copy_(p).requires_grad_()
        out[k] = p
    return out
