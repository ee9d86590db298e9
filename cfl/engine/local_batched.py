"""Train all sampled clients at once: stacked parameters, ``torch.func.vmap`` over one-client code.

Each client keeps its own data order, step count and (per-client-seeded) replay draws, so results
match the sequential trainer up to float rounding (dropout masks and augmentation aside: both draw from
torch's global generator, in a different order). Clients train sorted by step count, so the clients still
training at a step are a prefix of the stack; a short batch (a client's last of an epoch) is padded with
weight-0 copies of its first sample, and replay samples are padded to the client with the most. On a model
whose layers mix samples (BatchNorm on batch statistics: :func:`couples_samples`) padding would enter the
statistics, so there each step instead groups its clients by real batch and replay sizes and runs every
group unpadded (:func:`_size_groups`).

The parameter update is the memory-bound part of a step (the stacked parameters are read and written
once per step); see :class:`SGDStep` and ``docs/performance.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import torch
from torch import nn
from torch.func import functional_call, vmap

from cfl.engine import hooks, local_optim
from cfl.engine.batched_forward import buffered_forward, plain_forward
from cfl.engine.batched_steps import (
    carry_on,
    drawn_samples,
    leaf_row,
    loss_samples,
    preconditioners_of,
    rewritten,
)
from cfl.engine.heap import retain_freed_memory
from cfl.engine.jobs import ClientJob, ClientOutcome, Hyper, Plugins, epoch_orders, replay_generator
from cfl.engine.path import choose_path
from cfl.engine.precision import autocast, to_float, warn_if_slow
from cfl.engine.stacked_loss import loss_targets, weighted_cross_entropy
from cfl.engine.stacked_net import StackedNet
from cfl.engine.stacking import Batch, client_rows, couples_samples, pad_samples, sample_counts, stack_states
from cfl.engine.step_hooks import STEP_HOOKS, StepStage, step_key, task_loss_of
from cfl.methods.base import Method, overrides
from cfl.methods.hook_guard import VMAPPED_HOOKS
from cfl.methods.hook_types import Samples
from cfl.ops.losses import masked_cross_entropy, weighted_mean
from cfl.tensors import Params, State

#: hooks that read the stacked client states (under ``vmap``, and the step hooks outside it)
_VMAPPED = tuple(dict.fromkeys((*VMAPPED_HOOKS, *STEP_HOOKS)))


def _padded_schedule(jobs: list[ClientJob], hp: Hyper,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """(S, C, B) sample indices and 0/1 weights (step-major, so a step's rows are contiguous), the (C, S)
    real batch sizes (CPU; 0 past a client's last step) and each client's step count; short batches are
    padded with weight 0. Built in a fixed number of operators besides the clients' shuffles (one
    ``randperm`` per client and epoch: :func:`cfl.engine.jobs.epoch_orders`), all on the CPU but the
    indexing of the clients' sample ids, then moved to ``device`` once."""
    B = hp.batch_size
    orders = [epoch_orders(job, hp) for job in jobs]
    sizes = [[min(B, len(o) - i) for o in client for i in range(0, len(o), B)] for client in orders]
    client_steps = [len(s) for s in sizes]
    steps = max(client_steps)
    lengths = torch.tensor([s + [0] * (steps - len(s)) for s in sizes], dtype=torch.long).view(len(jobs), steps)
    starts = list(accumulate((len(job.indices) for job in jobs[:-1]), initial=0))
    ids = torch.cat([job.indices for job in jobs])
    # each client's positions shifted to its own ids in ``ids``
    shift = torch.tensor([start for start, client in zip(starts, orders, strict=True) for o in client
                          for _ in range(len(o))], dtype=torch.long)
    picked = ids[torch.cat([o for client in orders for o in client]).add_(shift).to(ids.device)]
    used = torch.arange(B) < lengths.unsqueeze(-1)  # (C, S, B): row-major = each client's batches in order
    # padding repeats the client's own first sample, so one client's data never enters another's graph
    index = ids[torch.tensor(starts).to(ids.device)].view(1, -1, 1).expand(steps, len(jobs), B).clone()
    index.transpose(0, 1)[used.to(index.device)] = picked
    weight = used.transpose(0, 1).to(torch.get_default_dtype())
    return index.to(device), weight.to(device), lengths, client_steps


class SGDStep:
    """Plain SGD with weight decay on stacked parameters, leaving clients without a step at ``s`` untouched.

    Without momentum or gradient projections the decay is folded into the update with one ``lerp_`` pass:
    the loss is scaled by ``-1/wd`` so the gradients come back as ``-g/wd`` and
    ``p + lr*wd * (-g/wd - p) = (1 - lr*wd) p - lr g``. That reads the parameters and gradients once and
    writes the parameters once, against three read-write passes for "decay, then step".
    """

    def __init__(self, hp: Hyper, params: Params, plugins: Plugins, stepping: bool = False) -> None:
        self.hp = hp
        self.projecting = [i for i, m in enumerate(plugins.methods) if overrides(m, "gradient_projection")]
        # step hooks must see the true gradient, not the folded decay's -g/wd
        self.fused = hp.momentum == 0 and not self.projecting and not stepping
        self.fold_decay = self.fused and hp.weight_decay >= 1e-8  # smaller: -1/wd could overflow float32
        self.loss_scale = -1.0 / hp.weight_decay if self.fold_decay else 1.0
        self.momentum: list[torch.Tensor] | None = None
        self.kept = False  # optimizer.state: kept: the momentum buffers start from the clients' own
        self.names = list(params)
        self.shapes = {k: (-1,) + (1,) * (v.dim() - 1) for k, v in params.items()}

    def keep(self, slots: dict[str, list[torch.Tensor]]) -> None:
        """Start from the clients' kept momentum buffers (:func:`cfl.engine.local_optim.kept_state`)."""
        self.momentum, self.kept = [slots[k][0] for k in self.names], True

    def kept_slots(self) -> dict[str, list[torch.Tensor]]:
        return {k: [b] for k, b in zip(self.names, self.momentum, strict=True)}

    def __call__(self, s: int | torch.Tensor, params: Params, grads: Params, active: torch.Tensor | None, states: list,
                 plugins: Plugins) -> None:
        """``grads`` are those of ``loss_scale`` x the summed client losses; ``active`` (C,) or None (all); ``s``
        the step (kept state: each client's steps so far, ``(n,)``)."""
        hp, p, g = self.hp, list(params.values()), list(grads.values())
        if self.fold_decay:
            if active is None:
                torch._foreach_lerp_(p, g, hp.lr * hp.weight_decay)
            else:
                rate = active.to(p[0].dtype) * (hp.lr * hp.weight_decay)
                for k, pk, gk in zip(params, p, g, strict=True):
                    pk.lerp_(gk, rate.view(self.shapes[k]))
            return
        if hp.weight_decay:
            torch._foreach_add_(g, p, alpha=hp.weight_decay)
        for i in self.projecting:
            g = list(_projected(plugins.methods[i], dict(zip(params, g, strict=True)), states[i]).values())
        if hp.momentum > 0:
            if not self.kept and s == 0:
                self.momentum = [gk.clone() for gk in g]
            bufs = [b[: gk.shape[0]] for b, gk in zip(self.momentum, g, strict=True)]  # the clients still training
            if self.kept or s > 0:
                torch._foreach_mul_(bufs, hp.momentum)
                torch._foreach_add_(bufs, g)
            g = bufs
        if active is None:
            torch._foreach_add_(p, g, alpha=-hp.lr)
        else:
            on = active.to(p[0].dtype)
            for k, pk, gk in zip(params, p, g, strict=True):
                pk.addcmul_(gk, on.view(self.shapes[k]), value=-hp.lr)


class OptimStep:
    """Momentum-free SGD's counterpart for Adam and AdamW (:mod:`cfl.engine.local_optim`) on stacked parameters:
    per-client moments ``(C, ...)``, fresh each round; a step updates only the clients still training (the
    prefix of the stack in ``params``), so a client past its last step keeps its moments and parameters."""

    loss_scale = 1.0

    def __init__(self, hp: Hyper, params: Params, plugins: Plugins, stepping: bool = False) -> None:  # noqa: ARG002
        self.hp = hp
        self.projecting = [i for i, m in enumerate(plugins.methods) if overrides(m, "gradient_projection")]
        self.slots: dict[str, list[torch.Tensor]] | None = None

    def keep(self, slots: dict[str, list[torch.Tensor]]) -> None:
        """Start from the clients' kept moments (:func:`cfl.engine.local_optim.kept_state`)."""
        self.slots = slots

    def kept_slots(self) -> dict[str, list[torch.Tensor]]:
        return self.slots

    def __call__(self, s: int | torch.Tensor, params: Params, grads: Params, active: torch.Tensor | None,
                 states: list, plugins: Plugins) -> None:
        """As :meth:`SGDStep.__call__`; ``active`` must be None (every client in ``params`` steps)."""
        if active is not None:
            raise ValueError("OptimStep steps every client it is given; pass the clients still training")
        if self.slots is None:  # the first step (after the parameters took the gradients' layout)
            self.slots = {k: local_optim.new_slots(self.hp, v) for k, v in params.items()}
        g = {k: local_optim.decayed(self.hp, params[k], gk) for k, gk in grads.items()}
        for i in self.projecting:  # GPM: the projected gradient enters the moments
            g = _projected(plugins.methods[i], g, states[i])
        for k, p in params.items():
            local_optim.apply_(self.hp, p, g[k], [slot[: p.shape[0]] for slot in self.slots[k]], s + 1)


def _projected(method: Method, grads: Params, state: State) -> Params:
    """The stacked clients' gradients projected off ``method.gradient_projection``, per client under ``vmap``.
    Where no client of the stack holds state (``state`` is ``{}``) every client's hook sees ``{}``: it is
    called once and its bases, if any, apply to all (a hook that reads no state projects all the same)."""
    if state:
        return vmap(lambda gr, st: hooks.projected(method, gr, st))(grads, state)
    bases = hooks.state_free_bases(method, {k: v[0] for k, v in grads.items()})
    return vmap(lambda gr: hooks.project(gr, bases))(grads) if bases else grads


def train_batched(model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                  y: torch.Tensor, task: int, hp: Hyper, plugins: Plugins,
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
    if plugins.starts is not None or plugins.frozen:  # the run's path is sequential then (cfl/engine/path.py)
        raise ValueError("train_batched starts every client from the global model and moves every parameter: "
                         "parameters kept per client or frozen ones train with train_sequential")
    order = sorted(range(len(jobs)), key=lambda c: -len(jobs[c].indices))  # stable: ties keep job order
    ordered = [jobs[c] for c in order]
    block = hp.client_block or auto_client_block(model, x.device, len(jobs))
    path = hp.path or choose_path(model, hp, plugins.methods).path
    stacked = StackedNet(model, hp) if path == "stacked" else None
    full = stacked.stack(global_params, len(jobs), workspace) if stacked is not None else None
    parts, outcomes = [], []
    for start in range(0, len(ordered), block):
        chunk = ordered[start : start + block]
        if full is not None:  # the block trains in its slice of the stacked buffers
            params = stacked.leaves({k: v[start : start + len(chunk)] for k, v in full.items()})
        else:
            params = {k: _stacked_leaf(v, len(chunk)) for k, v in global_params.items()}
        buffers = {k: torch.stack([job.buffers[k] for job in chunk]) for k in chunk[0].buffers}
        trained, block_outcomes = _train_sorted(model, global_params, params, chunk, x, y, task, hp, plugins, stacked,
                                                buffers)
        parts.append(trained)
        outcomes += block_outcomes
    if full is not None:
        params = {k: v.detach() for k, v in full.items()}
    else:
        params = parts[0] if len(parts) == 1 else {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
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
    (``docs/performance.md``)."""
    if device.type == "cpu" and any(isinstance(m, nn.Conv2d) for m in model.modules()):
        return 1
    return max(clients, 1)


class BatchedTrainer:
    """:func:`train_batched` with one workspace kept across calls: what the round engine uses, since it
    consumes each round's client models before the next round starts."""

    def __init__(self) -> None:
        self.workspace: Params = {}
        retain_freed_memory()

    def __call__(self, model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                 y: torch.Tensor, task: int, hp: Hyper, plugins: Plugins) -> tuple[Params, list[ClientOutcome]]:
        return train_batched(model, global_params, jobs, x, y, task, hp, plugins, self.workspace)


def _train_sorted(model: nn.Module, global_params: Params, params: Params, jobs: list[ClientJob], x: torch.Tensor,
                  y: torch.Tensor, task: int, hp: Hyper, plugins: Plugins, stacked: StackedNet | None,
                  client_buffers: Params) -> tuple[Params, list[ClientOutcome]]:
    """Train ``jobs`` (sorted by steps, most first) together from the stacked ``params``: in place through
    ``stacked``'s fused steps, else by autograd under ``vmap``. ``client_buffers``: the clients' BatchNorm running
    statistics stacked ``(C, ...)`` (``{}`` without any; never on the stacked path), updated by their forwards
    and returned in the outcomes."""
    device = x.device
    C = len(jobs)
    token = torch.zeros((), device=device, requires_grad=True) if stacked is not None else None
    buffers = dict(model.named_buffers())
    index, weight, sizes, client_steps = _padded_schedule(jobs, hp, device)
    coupled = couples_samples(model)
    steps_left = torch.tensor([max(k, 1) for k in client_steps], dtype=torch.get_default_dtype(), device=device)
    allowed = _stack_allowed(jobs)
    cids = [job.cid for job in jobs]
    states = [_stacked_states(m, plugins.client_states(i, cids)) for i, m in enumerate(plugins.methods)]
    replaying = [(m, plugins.client_states(i, cids), plugins.broadcasts[i]) for i, m in enumerate(plugins.methods)
                 if overrides(m, "replay")]
    generators = [replay_generator(job) for job in jobs]
    stage = StepStage.of(plugins.methods, plugins.broadcasts, global_params, hp.lr, model, hp.precision, device)
    if stage is not None and stacked is not None:
        raise ValueError("the stacked path takes no step hooks (cfl.engine.path.choose_path routes them to vmap)")
    raw_states = [plugins.client_states(i, cids) for i in range(len(plugins.methods))]
    starts = [stage.start([st[c] for st in raw_states]) for c in range(C)] if stage else []
    carry = stage.stacked(starts) if stage else {}
    keys = torch.stack([step_key(job, device) for job in jobs]) if stage else None
    update = (SGDStep if hp.optimizer == "sgd" else OptimStep)(hp, params, plugins, stage is not None)
    kept = None  # optimizer.state: kept: the clients' stacked optimiser state and step counts so far
    if hp.optimizer_state == "kept" and not local_optim.plain_sgd(hp):
        kept = local_optim.kept_state(hp, global_params, [plugins.optimizer.get(c) for c in cids])
        kept = ({k: [v.to(device) for v in vs] for k, vs in kept[0].items()}, kept[1].to(device))
        update.keep(kept[0])
    if stacked is not None:
        stacked.new_state(params, None if kept is None else kept[0])
    # the stacked path takes quadratic penalties' steps from their gradients (no penalty in the loss)
    penalty = stacked.penalty_steps([hooks.penalty_terms(m, global_params, plugins.broadcasts[i], states[i])
                                     for i, m in enumerate(plugins.methods) if overrides(m, "penalty")],
                                    params) if stacked is not None else {}
    # layer preconditioners (RGO), once per round: (C or 1, d, d) per weight, the methods' products in order
    matrices = preconditioners_of(plugins, global_params, states)
    task_ids = torch.full((C, hp.batch_size), task, dtype=y.dtype, device=device)
    x_shape = (C * hp.batch_size, *x.shape[1:])
    x_buffer = torch.empty(x_shape, dtype=x.dtype, device=device) if stacked is None else \
        stacked.scratch.get("x", x_shape, x.dtype, device)
    labels = y[index]  # (S, C, B): every step's labels in one operator
    if stacked is not None:  # the steps' losses, (S, C): their sums and finiteness are read at the end
        losses = torch.zeros(index.shape[0], C, device=device) if replaying else None
        targets, excluded = None, None if allowed is None else ~allowed.unsqueeze(-2)
    else:
        loss_sum = torch.zeros(C, device=device)
        finite = torch.ones(C, dtype=torch.bool, device=device)

    def forward(p: Params, xb: torch.Tensor, tb: torch.Tensor) -> torch.Tensor:
        with autocast(hp.precision, device):  # bf16-mixed: products in bfloat16, the loss on float32 logits
            return to_float(functional_call(model, (p, buffers), (xb, tb)))

    batched_forward = buffered_forward(model, hp, device, client_buffers) if client_buffers else \
        plain_forward(vmap(forward, randomness="different"))
    model.train()
    full_params = params
    for s in range(index.shape[0]):
        n = sum(steps > s for steps in client_steps)  # clients still training: a prefix (sorted by steps)
        params = full_params if n == C else {k: v[:n] for k, v in full_params.items()}
        step_states = states if n == C else [client_rows(st, n) for st in states]
        rows = index[s, :n].reshape(-1)  # gathered into one buffer per call: no fresh pages each step
        xb = torch.index_select(x, 0, rows, out=x_buffer[: rows.numel()]).view(n, -1, *x.shape[1:])
        yb, wb, tb = labels[s, :n], weight[s, :n], task_ids[:n]
        if hp.augment is not None:  # per sample, over the (clients x batch) samples at once
            xb = hp.augment(xb.flatten(0, 1), None).view_as(xb)
        draws = [[hooks.replayed(m, raw[c], generators[c], x, b) for c in range(n)] for m, raw, b in replaying]
        extras = [pad_samples(d) for d in draws]
        step_raw = [st[:n] for st in raw_states]
        # the step hooks' draws, after replay's and before the loss (``extra_loss`` may take them)
        counts, drawn = drawn_samples(stage, n, step_raw, generators, x, carry, starts) if stage is not None \
            else ({}, {})
        # the clients' prefix of the penalty steps (a client dim of 1, shared by all, stays 1)
        step_penalty = penalty if n == C else {k: (None if m is None else m[:n], None if b is None else b[:n])
                                               for k, (m, b) in penalty.items()}
        step_allowed = None if allowed is None else allowed[:n]
        step_matrices = {k: v if v.shape[0] == 1 or n == C else v[:n] for k, v in matrices.items()}
        if stacked is not None:  # no layer couples samples (StackedNet.model_refusal): padding is inert
            xb, yb, tb, wb = _with_replay((xb, yb, tb, wb), extras)
            stacked.t = s + 1 if kept is None else kept[1][:n] + (s + 1)
            stacked.preconditioners = step_matrices
            logits = stacked.forward(params, xb, tb, token, step_penalty)
            if excluded is not None:
                logits = logits.masked_fill(excluded[:n], float("-inf"))
            step_excluded = None if excluded is None else excluded[:n]
            if replaying:  # the step's own widths: targets of this step, its losses summed now
                step_targets = loss_targets(yb, wb, logits.shape[-1])
                grad_logits = weighted_cross_entropy(logits, step_targets, step_excluded)
                torch.sum(step_targets.view(n, -1), -1, out=losses[s, :n])
            else:  # the round's targets, once (S, C, B, classes); their sums are the losses, read at the end
                if targets is None:
                    targets = loss_targets(labels, weight, logits.shape[-1])
                grad_logits = weighted_cross_entropy(logits, targets[s, :n], step_excluded)
            stacked.backward_and_step(logits, params, token, step_penalty, grad_logits)
            continue
        else:
            to_loss = loss_samples(plugins.methods, counts, drawn)
            groups = _size_groups(sizes[:n, s], [sample_counts(d) for d in draws] + [c for c, _ in to_loss.values()],
                                  hp.batch_size, coupled, device)
            cross_entropy, per_client = _grouped_losses(groups, (xb, yb, tb, wb), extras, params, step_allowed,
                                                        step_states, batched_forward, plugins,
                                                        {i: b for i, (_, b) in to_loss.items()})
        loss_sum[:n] += cross_entropy.detach()
        for i, m in enumerate(plugins.methods):
            if overrides(m, "penalty"):
                pen = vmap(lambda p, st, m=m, b=plugins.broadcasts[i]: hooks.penalty_loss(m, p, global_params, b, st),
                           randomness="different")(params, step_states[i])
                per_client = per_client + pen
        finite[:n] &= torch.isfinite(per_client.detach())
        grads = torch.autograd.grad(per_client.sum() * update.loss_scale, list(params.values()))
        with torch.no_grad():
            if s == 0 and n == C:
                params = full_params = _match_grad_layout(params, grads)
            grads = dict(zip(params, grads, strict=True))
            if stage is not None:  # the step hooks: after the loss gradient, before the optimiser
                step_data = _with_replay((xb, yb, tb, wb), extras), step_raw, step_states
                grads, before = rewritten(stage, s, n, params, grads, drawn, carry, step_data, keys)
            grads = {k: hooks.precondition(g, step_matrices[k]) if k in step_matrices else g for k, g in grads.items()}
            # SGD's decay adds into the gradients in place: carry_step must see the gradient before it
            carrying = stage is not None and bool(stage.carry_stepping)
            update(s if kept is None else kept[1][:n] + s, params,
                   {k: g.clone() for k, g in grads.items()} if carrying else grads, None, step_states, plugins)
            if carrying:
                carry_on(stage, s, n, params, grads, before, drawn, carry, step_data, keys)
    carries = [{i: leaf_row(ci, c, starts[c][i]) for i, ci in carry.items()} for c in range(C)]
    if stacked is not None:  # a loss is >= 0 or NaN: finite where below infinity
        if targets is not None:
            losses = targets.flatten(2).sum(-1)
        elif losses is None:  # no step at all
            losses = torch.zeros(index.shape[0], C, device=device)
        loss_sum, finite = losses.sum(0), (losses < float("inf")).all(0)
    mean_loss = (loss_sum / steps_left).tolist()
    finite_list = finite.tolist()
    slots = None if kept is None else (stacked.slots if stacked is not None else update.kept_slots())
    outcomes = [ClientOutcome(job.cid, len(job.indices), mean_loss[c], finite_list[c], carries[c] if carry else {},
                              {} if kept is None else local_optim.stored_state(slots, kept[1][c] + client_steps[c], c),
                              {k: v[c] for k, v in client_buffers.items()}, client_steps[c])
                for c, job in enumerate(jobs)]
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


StepBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # x, y, task, weight: (n, width, ...)


#: client indices (None: all), batch width, replay widths (then those of the draws an ``extra_loss`` takes)
Group = tuple[torch.Tensor | None, int, list[int]]


def _size_groups(sizes: torch.Tensor, replay_counts: list[list[int]], width: int, coupled: bool,
                 device: torch.device) -> list[Group]:
    """The step's client groups as ``(client indices or None for all, batch width, replay widths)``
    (``replay_counts`` may go on with the counts of the draws an ``extra_loss`` takes: widths of those as well).

    Samples independent of each other: one group at the padded widths. Coupled: one group per distinct
    real (batch size, replay sizes) among the clients' (CPU) ``sizes`` and ``replay_counts`` (per method,
    per client), each at those sizes, so every client's forward sees exactly its real samples, as in the
    sequential trainer; one group, unindexed, when all clients agree."""
    if not coupled:
        return [(None, width, [max(counts) for counts in replay_counts])]
    keys = [(int(b), *(counts[c] for counts in replay_counts)) for c, b in enumerate(sizes.tolist())]
    distinct = sorted(set(keys))
    if len(distinct) == 1:
        return [(None, distinct[0][0], list(distinct[0][1:]))]
    return [(torch.tensor([c for c, k in enumerate(keys) if k == key], device=device), key[0], list(key[1:]))
            for key in distinct]


def _with_replay(data: StepBatch, extras: list[Batch | None]) -> StepBatch:
    """The step's data with each method's replay samples appended after it, per client."""
    x, y, t, w = data
    for extra in extras:
        if extra is not None:
            x, y = torch.cat([x, extra.x], 1), torch.cat([y, extra.y], 1)
            t, w = torch.cat([t, extra.task], 1), torch.cat([w, extra.weight], 1)
    return x, y, t, w


def _grouped_losses(groups: list[Group], data: StepBatch, extras: list[Batch | None], params: Params,
                    allowed: torch.Tensor | None, states: list[State], forward: Callable,
                    plugins: Plugins, samples: dict[int, Batch | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per client (n,): the weighted cross-entropy of the step, and it plus the methods' extra losses; each
    group of :func:`_size_groups` runs its own ``vmap``-ed forward on its clients' real samples. ``samples``:
    per method whose ``extra_loss`` takes them, its ``step_samples`` draw (their widths follow the replay
    widths in a group's)."""
    ce_parts, loss_parts = [], []
    for idx, width, widths in groups:
        def pick(v: torch.Tensor, idx: torch.Tensor | None = idx) -> torch.Tensor:
            return v if idx is None else v.index_select(0, idx)

        def cut(e: Batch | None, w: int) -> Batch | None:
            return None if e is None or w == 0 else Batch(*(pick(v)[:, :w] for v in (e.x, e.y, e.task, e.weight)),
                                                          {k: pick(v)[:, :w] for k, v in e.extra.items()})

        replays = [cut(e, w) for e, w in zip(extras, widths[:len(extras)], strict=True)]
        drawn = {i: cut(e, w) for (i, e), w in zip(samples.items(), widths[len(extras):], strict=True)}
        xb, yb, tb, wb = _with_replay(tuple(pick(v)[:, :width] for v in data), replays)
        p = {k: pick(v) for k, v in params.items()}
        own = task_loss_of(plugins.methods)
        if own is None:
            cross_entropy = weighted_mean(masked_cross_entropy(forward(p, xb, tb, idx), yb, None if allowed is None
                                                               else pick(allowed)), wb)
        else:  # the method's own per-sample loss in place of the cross-entropy
            own_losses = _own_losses(plugins, own, p, forward(p, xb, tb, idx), (xb, yb, tb, wb),
                                     None if allowed is None else pick(allowed), client_rows_of(states[own], pick))
            cross_entropy = weighted_mean(hooks.differentiable(plugins.methods[own], own_losses), wb)
        loss = cross_entropy
        for i, m in enumerate(plugins.methods):
            if overrides(m, "extra_loss"):
                loss = loss + _extra_losses(m, plugins.broadcasts[i], (p, xb, tb, wb, client_rows_of(states[i], pick)),
                                            drawn.get(i))
        ce_parts.append(cross_entropy)
        loss_parts.append(loss)
    if len(groups) == 1:
        return ce_parts[0], loss_parts[0]
    order = torch.cat([idx for idx, _, _ in groups])
    back = torch.empty_like(order)
    back[order] = torch.arange(len(order), device=order.device)
    return torch.cat(ce_parts)[back], torch.cat(loss_parts)[back]


def _extra_losses(method: Method, server: State, args: tuple, samples: Batch | None) -> torch.Tensor:
    """``method``'s ``extra_loss`` per client ``(n,)`` under ``vmap``; ``args``: the stacked params, x, task, weight
    and state; ``samples``: the method's draw of the step, or None."""
    if samples is None:
        return vmap(lambda *a: hooks.extra_loss(method, *a[:4], server, a[4]), randomness="different")(*args)
    return vmap(lambda *a: hooks.extra_loss(method, *a[:4], server, a[4], Samples(*a[5:])),
                randomness="different")(*args, samples.x, samples.y, samples.task, samples.weight, samples.extra)


def _own_losses(plugins: Plugins, i: int, params: Params, logits: torch.Tensor, data: StepBatch,
                allowed: torch.Tensor | None, state: State) -> torch.Tensor:
    """Method ``i``'s ``task_loss`` per client and sample ``(n, B)``, under ``vmap``."""
    m, server = plugins.methods[i], plugins.broadcasts[i]
    x, y, t, w = data
    if allowed is None:
        return vmap(lambda p, lg, yy, xx, tt, ww, st: hooks.task_loss(m, p, lg, yy, xx, tt, ww, None, server, st),
                    randomness="different")(params, logits, y, x, t, w, state)
    return vmap(lambda p, lg, yy, xx, tt, ww, al, st: hooks.task_loss(m, p, lg, yy, xx, tt, ww, al, server, st),
                randomness="different")(params, logits, y, x, t, w, allowed, state)


def client_rows_of(state: State, pick: Callable[[torch.Tensor], torch.Tensor]) -> State:
    """``pick`` applied to every leaf of a stacked state."""
    return {k: client_rows_of(v, pick) if isinstance(v, dict) else pick(v) for k, v in state.items()}


def _stacked_states(method: Method, states: list[State]) -> State:
    """The clients' states stacked for the hooks that run under ``vmap`` ({} when the method has none)."""
    if not any(overrides(method, hook) for hook in _VMAPPED):
        return {}
    return stack_states(states, method.ragged)


def _stack_allowed(jobs: list[ClientJob]) -> torch.Tensor | None:
    if jobs[0].allowed is None:
        return None
    return torch.stack([job.allowed for job in jobs])
