"""The batched trainer's stacked path: every client's parameters in one stacked tensor, trained in place through
:class:`cfl.engine.local.stacked_net.StackedNet`'s fused steps (each linear layer's optimiser step taken in its
backward; quadratic penalties as steps, never in the loss). :func:`cfl.engine.local.path.choose_path` routes here the
models and methods it runs (no layer couples samples, so weight-0 padding is inert); the sequential trainer is
the oracle it is tested against (``tests/engine/test_batched_equals_sequential.py``)."""

from __future__ import annotations

import torch
from torch import nn

from cfl.engine.local import hooks
from cfl.engine.local.batched_round import BatchedRound, client_blocks, prefix_rows, stacked_buffers, with_replay
from cfl.engine.local.batched_steps import preconditioners_of
from cfl.engine.local.jobs import ClientJob, ClientOutcome, Hyper, RoundMethods
from cfl.engine.local.stacked_loss import loss_targets, weighted_cross_entropy
from cfl.engine.local.stacked_net import StackedNet
from cfl.engine.local.step_hooks import takes_steps
from cfl.methods.declarations import gives
from cfl.tensors import Params


def train_stacked(model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor, y: torch.Tensor,
                  task: int, hp: Hyper, round_methods: RoundMethods, block: int,
                  workspace: Params | None) -> tuple[Params, list[ClientOutcome]]:
    """Train the sorted ``jobs`` in blocks of ``block`` clients, each block in its slice of the stacked buffers
    kept in ``workspace`` (returned: valid until the next call with the same workspace)."""
    if any(takes_steps(m) for m in round_methods.methods):
        raise ValueError("the stacked path takes no step hooks (cfl.engine.local.path.choose_path routes them to vmap)")
    net = StackedNet(model, hp)
    full = net.stack(global_params, len(jobs), workspace)
    outcomes = []
    for start, chunk in client_blocks(jobs, block):
        params = net.leaves({k: v[start : start + len(chunk)] for k, v in full.items()})
        outcomes += _train_block(model, global_params, params, chunk, x, y, task, hp, round_methods, net,
                                 stacked_buffers(chunk))
    return {k: v.detach() for k, v in full.items()}, outcomes


def _train_block(model: nn.Module, global_params: Params, params: Params, jobs: list[ClientJob], x: torch.Tensor,
                 y: torch.Tensor, task: int, hp: Hyper, round_methods: RoundMethods, net: StackedNet,
                 client_buffers: Params) -> list[ClientOutcome]:
    """One block's round, in place in ``params``; ``client_buffers`` come back unchanged in the outcomes (no
    running statistics on this path)."""
    device = x.device
    C = len(jobs)
    token = torch.zeros((), device=device, requires_grad=True)
    r = BatchedRound.of(global_params, jobs, x, y, task, hp, round_methods, net.scratch)
    net.new_state(params, None if r.kept is None else r.kept[0])
    # quadratic penalties' steps from their gradients (no penalty in the loss)
    penalty = net.penalty_steps([hooks.penalty_terms(m, global_params, round_methods.broadcasts[i], r.states[i])
                                 for i, m in enumerate(round_methods.methods) if gives(m, "penalty")], params)
    # layer preconditioners (RGO), once per round: (C or 1, d, d) per weight, the methods' products in order
    matrices = preconditioners_of(round_methods, global_params, r.states)
    # the steps' losses, (S, C): their sums and finiteness are read at the end
    losses = torch.zeros(r.steps, C, device=device) if r.replaying else None
    targets, excluded = None, None if r.allowed is None else ~r.allowed.unsqueeze(-2)
    model.train()
    for s in range(r.steps):
        step = r.step(s)
        n = step.n
        step_params = params if n == C else {k: v[:n] for k, v in params.items()}
        # the clients' prefix of the penalty steps (a client dim of 1, shared by all, stays 1)
        step_penalty = penalty if n == C else {k: (None if m is None else m[:n], None if b is None else b[:n])
                                               for k, (m, b) in penalty.items()}
        xb, yb, tb, wb = with_replay(step.data, step.extras)
        net.t = s + 1 if r.kept is None else r.kept[1][:n] + (s + 1)
        net.preconditioners = prefix_rows(matrices, n)
        logits = net.forward(step_params, xb, tb, token, step_penalty)
        if excluded is not None:
            logits = logits.masked_fill(excluded[:n], float("-inf"))
        step_excluded = None if excluded is None else excluded[:n]
        if r.replaying:  # the step's own widths: targets of this step, its losses summed now
            step_targets = loss_targets(yb, wb, logits.shape[-1])
            grad_logits = weighted_cross_entropy(logits, step_targets, step_excluded)
            torch.sum(step_targets.view(n, -1), -1, out=losses[s, :n])
        else:  # the round's targets, once (S, C, B, classes); their sums are the losses, read at the end
            if targets is None:
                targets = loss_targets(r.labels, r.weight, logits.shape[-1])
            grad_logits = weighted_cross_entropy(logits, targets[s, :n], step_excluded)
        net.backward_and_step(logits, step_params, token, step_penalty, grad_logits)
    if targets is not None:
        losses = targets.flatten(2).sum(-1)
    elif losses is None:  # no step at all
        losses = torch.zeros(r.steps, C, device=device)
    # a loss is >= 0 or NaN: finite where below infinity
    return r.outcomes(losses.sum(0), (losses < float("inf")).all(0), None, net.slots, client_buffers)
