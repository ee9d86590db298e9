"""The plain per-client trainer: one client after another, one ordinary forward/backward per step.

It calls the very same method hooks as the batched trainer, without ``vmap``, and is the oracle the
batched trainer is tested against.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from cfl.engine.local import hooks, local_optim
from cfl.engine.local.jobs import ClientJob, ClientOutcome, Hyper, RoundMethods, client_schedule, replay_generator
from cfl.engine.local.precision import autocast, to_float, warn_if_slow
from cfl.engine.local.step_hooks import StepStage, as_batch, step_key, task_loss_of
from cfl.methods.declarations import gives
from cfl.methods.hook_types import Samples
from cfl.ops.losses import masked_cross_entropy
from cfl.tensors import Params


def train_one(model: nn.Module, global_params: Params, job: ClientJob, x: torch.Tensor, y: torch.Tensor,
              task: int, hp: Hyper, round_methods: RoundMethods) -> tuple[Params, ClientOutcome]:
    warn_if_slow(hp.precision, x.device)
    # its own starting point where param_roles makes parameters local
    start = round_methods.starts[job.cid] if round_methods.starts is not None else global_params
    params = {k: v.detach().clone().requires_grad_(k not in round_methods.frozen) for k, v in start.items()}
    trainable = [k for k in params if k not in round_methods.frozen]  # param_roles frozen: no gradient, step or state
    own = {k: local_optim.param_hyper(hp, k) for k in trainable}  # lr_groups: a parameter's own learning rate
    # BatchNorm running statistics: the client's own copy, updated in place by its training forwards
    buffers = {k: v.detach().clone() for k, v in job.buffers.items()}
    tensors = (params, buffers) if buffers else params
    kept = round_methods.optimizer if hp.optimizer_state == "kept" else None
    if kept is None:
        slots, t0 = {k: local_optim.new_slots(hp, params[k]) for k in trainable}, 0  # fresh each round
    else:  # the client's own state from its earlier rounds
        stacked, steps = local_optim.kept_state(hp, {k: global_params[k] for k in trainable}, [kept.get(job.cid)])
        slots, t0 = {k: [v[0] for v in vs] for k, vs in stacked.items()}, int(steps[0])
    methods, broadcasts = round_methods.methods, round_methods.broadcasts
    states = [st.clients.get(job.cid) for st in round_methods.states]
    generator = replay_generator(job)
    stage = StepStage.of(methods, broadcasts, global_params, hp.lr, model, hp.precision, x.device)
    carry = stage.start(states) if stage is not None else {}
    key = step_key(job, x.device)
    own_loss = task_loss_of(methods)
    # layer preconditioners (RGO): once per round, from the client's state
    matrices = [hooks.preconditioners(m, global_params, states[i]) for i, m in enumerate(methods)
                if gives(m, "preconditioner")]
    losses, finite = [], True
    model.train()
    for s, batch in enumerate(client_schedule(job, hp)):
        xb, yb = x[batch], y[batch]
        if hp.augment is not None:
            xb = hp.augment(xb, None)
        tb = torch.full_like(yb, task)
        wb = torch.ones(len(batch), device=x.device)
        for i, m in enumerate(methods):
            extra = hooks.replayed(m, states[i], generator, x, broadcasts[i]) if gives(m, "replay") else None
            if extra is not None:
                xb, yb = torch.cat([xb, extra.x]), torch.cat([yb, extra.y])
                tb, wb = torch.cat([tb, extra.task]), torch.cat([wb, torch.ones(len(extra.y), device=x.device)])
        # the step draws, after every replay draw and before the loss (the loss's extra part gets them)
        drawn = {} if stage is None else \
            {i: as_batch(d, x.device) for i, d in stage.draw(states, generator, x, carry).items() if d is not None}
        with autocast(hp.precision, x.device):  # bf16-mixed: products in bfloat16, the loss on float32 logits
            logits = to_float(functional_call(model, tensors, (xb, tb)))
        per_sample = masked_cross_entropy(logits, yb, job.allowed) if own_loss is None else hooks.differentiable(
            methods[own_loss], hooks.task_loss(methods[own_loss], params, logits, yb, xb, tb, wb, job.allowed,
                                               broadcasts[own_loss], states[own_loss]))
        keep = wb > 0
        loss = (per_sample[keep] * wb[keep]).sum() / wb[keep].sum()
        losses.append(float(loss.detach()))
        for i, m in enumerate(methods):
            if gives(m, "extra"):
                loss = loss + hooks.extra_loss(m, params, xb, tb, wb, broadcasts[i], states[i],
                                               Samples(*drawn[i]) if i in drawn else None)
            if gives(m, "penalty"):
                loss = loss + hooks.penalty_loss(m, params, global_params, broadcasts[i], states[i])
        finite &= bool(torch.isfinite(loss))
        grads = dict(zip(trainable, torch.autograd.grad(loss, [params[k] for k in trainable]), strict=True)) \
            if trainable else {}  # every parameter frozen (a closed-form classifier): forward passes only
        if stage is not None:  # the step hooks: after the loss gradient, before the optimiser
            batch = (xb, yb, tb, wb)
            before = {k: v.detach().clone() for k, v in params.items()}
            with torch.no_grad(), stage.watched("step_gradient", s, before, grads, batch, drawn, states, carry):
                grads = stage.rewrite(before, grads, batch, drawn, states, carry, s, key)
        with torch.no_grad():
            for found in matrices:
                grads = {k: hooks.precondition(g, found[k]) if k in found else g for k, g in grads.items()}
            taken = grads
            grads = {k: local_optim.decayed(hp, params[k], g) for k, g in grads.items()}
            for i, m in enumerate(methods):
                if gives(m, "projection"):
                    grads = hooks.projected(m, grads, states[i])
            for k in trainable:
                local_optim.apply_(own[k], params[k], grads[k], slots[k], t0 + s + 1)
            if stage is not None and stage.carry_stepping:
                moved = {k: params[k].detach() - before[k] for k in params}
                with stage.watched("carry_step", s, before, taken, batch, drawn, states, carry, moved):
                    carry = stage.carried(before, taken, batch, drawn, states, carry, s, moved, key)
    mean_loss = sum(losses) / max(len(losses), 1)
    outcome = ClientOutcome(job.cid, len(job.indices), mean_loss, finite, carry,
                            {} if kept is None else local_optim.stored_state(slots, t0 + len(losses)), buffers,
                            len(losses))
    return {k: v.detach() for k, v in params.items()}, outcome


def train_sequential(model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                     y: torch.Tensor, task: int, hp: Hyper,
                     round_methods: RoundMethods) -> tuple[Params, list[ClientOutcome]]:
    """Same contract as :func:`cfl.engine.local.batched.train_batched`."""
    results = [train_one(model, global_params, job, x, y, task, hp, round_methods) for job in jobs]
    stacked = {k: torch.stack([r[0][k] for r in results]) for k in global_params}
    return stacked, [r[1] for r in results]
