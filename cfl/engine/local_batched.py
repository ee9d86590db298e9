"""Train all sampled clients at once: stacked parameters, ``torch.func.vmap`` over one-client code.

Each client keeps its own data order, step count and (per-client-seeded) replay draws, so results
match the sequential trainer up to float rounding (dropout masks aside: both draw from torch's global
generator, in a different order). Clients with fewer samples than others are padded: their extra
steps carry weight 0 and leave parameters untouched, which costs the padded compute.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vmap

from cfl.engine.jobs import ClientJob, ClientOutcome, Hyper, Plugins, client_schedule, replay_generator
from cfl.methods.base import Params
from cfl.ops.losses import masked_cross_entropy, weighted_mean


def _padded_schedule(jobs: list[ClientJob], hp: Hyper, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, S, B) sample indices and 0/1 weights; clients with fewer steps are padded with weight 0."""
    schedules = [client_schedule(job, hp) for job in jobs]
    steps = max(len(s) for s in schedules)
    # padding repeats the client's own first sample, so one client's data never enters another's graph
    index = torch.stack([job.indices[:1].expand(steps, hp.batch_size) for job in jobs]).clone()
    weight = torch.zeros(len(jobs), steps, hp.batch_size, device=device)
    for c, schedule in enumerate(schedules):
        for s, batch in enumerate(schedule):
            index[c, s, : len(batch)] = batch
            weight[c, s, : len(batch)] = 1.0
    return index, weight


def train_batched(model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                  y: torch.Tensor, task: int, hp: Hyper, plugins: Plugins) -> tuple[Params, list[ClientOutcome]]:
    """Run local SGD for every job at once; returns parameters stacked over clients (C, ...)."""
    device = x.device
    C = len(jobs)
    params = {k: v.detach().unsqueeze(0).repeat(C, *([1] * v.dim())).requires_grad_() for k, v in global_params.items()}
    buffers = dict(model.named_buffers())
    momentum = {k: torch.zeros_like(v) for k, v in params.items()} if hp.momentum > 0 else None
    index, weight = _padded_schedule(jobs, hp, device)
    allowed = _stack_allowed(jobs)
    cids = [job.cid for job in jobs]
    states = [m.stack_states(plugins.client_states(i, cids)) for i, m in enumerate(plugins.methods)]
    raw_states = [plugins.client_states(i, cids) for i in range(len(plugins.methods))]
    generators = [replay_generator(job) for job in jobs]
    loss_sum = torch.zeros(C, device=device)
    finite = torch.ones(C, dtype=torch.bool, device=device)

    def forward(p: Params, xb: torch.Tensor, tb: torch.Tensor) -> torch.Tensor:
        return functional_call(model, (p, buffers), (xb, tb))

    batched_forward = vmap(forward, randomness="different")
    model.train()
    for s in range(index.shape[1]):
        xb, yb, wb = x[index[:, s]], y[index[:, s]], weight[:, s]
        tb = torch.full_like(yb, task)
        for i, m in enumerate(plugins.methods):
            extra = m.replay_batch(raw_states[i], generators)
            if extra is not None:
                xb, yb = torch.cat([xb, extra.x], 1), torch.cat([yb, extra.y], 1)
                live = (wb.sum(1, keepdim=True) > 0).to(wb.dtype)  # no replay on a client's padded steps
                tb, wb = torch.cat([tb, extra.task], 1), torch.cat([wb, extra.weight * live], 1)
        logits = batched_forward(params, xb, tb)
        per_client = weighted_mean(masked_cross_entropy(logits, yb, allowed), wb)
        loss_sum += per_client.detach()
        for i, m in enumerate(plugins.methods):
            if m.has_batch_loss:
                per_client = per_client + vmap(m.batch_loss, in_dims=(0, 0, 0, 0, None, 0), randomness="different")(
                    params, xb, tb, wb, plugins.broadcasts[i], states[i])
            if m.has_penalty:
                pen = vmap(m.penalty, in_dims=(0, None, None, 0), randomness="different")(
                    params, global_params, plugins.broadcasts[i], states[i])
                per_client = per_client + pen
        finite &= torch.isfinite(per_client.detach())
        grads = torch.autograd.grad(per_client.sum(), list(params.values()))
        grads = dict(zip(params.keys(), grads, strict=True))
        with torch.no_grad():
            if hp.weight_decay:
                torch._foreach_add_(list(grads.values()), list(params.values()), alpha=hp.weight_decay)
            for i, m in enumerate(plugins.methods):
                if m.has_grad_transform:
                    grads = vmap(m.transform_grads)(grads, states[i])
            if momentum is not None:
                bufs = list(momentum.values())
                if s == 0:
                    torch._foreach_copy_(bufs, list(grads.values()))
                else:
                    torch._foreach_mul_(bufs, hp.momentum)
                    torch._foreach_add_(bufs, list(grads.values()))
                grads = dict(zip(params.keys(), bufs, strict=True))
            active = wb[:, : hp.batch_size].sum(1) > 0  # clients whose schedule has this step
            steps_taken = list(grads.values())
            if not bool(active.all()):
                steps_taken = [g * active.view(-1, *([1] * (g.dim() - 1))).to(g.dtype) for g in steps_taken]
            torch._foreach_add_(list(params.values()), steps_taken, alpha=-hp.lr)
    steps = (weight.sum(2) > 0).sum(1).clamp(min=1)
    outcomes = [ClientOutcome(job.cid, len(job.indices), float(loss_sum[c] / steps[c]), bool(finite[c]))
                for c, job in enumerate(jobs)]
    return {k: v.detach() for k, v in params.items()}, outcomes


def _stack_allowed(jobs: list[ClientJob]) -> torch.Tensor | None:
    if jobs[0].allowed is None:
        return None
    return torch.stack([job.allowed for job in jobs])
