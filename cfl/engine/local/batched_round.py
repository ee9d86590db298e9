"""The round setup both batched paths share (:mod:`cfl.engine.local.stacked`, :mod:`cfl.engine.local.vmap`).

A block of clients, sorted by step count (most first), so the clients still training at step ``s`` are a prefix
of the stack. Per round: each client's padded batch schedule (:func:`padded_schedule`), the methods' client
states (stacked for the hooks under ``vmap``, and as they are), the replay generators and the kept optimiser
state; per step: the clients still training, their gathered (and augmented) batch and their replay draws; at the
end, each client's outcome. Neither path's own work (forward, loss, step) is here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate

import torch

from cfl.engine.hook_call import takes
from cfl.engine.local import hooks, local_optim
from cfl.engine.local.jobs import ClientJob, ClientOutcome, Hyper, RoundMethods, epoch_orders, replay_generator
from cfl.engine.local.scratch import Scratch
from cfl.engine.local.stacking import Batch, pad_samples, stack_states
from cfl.engine.local.step_hooks import STEP_HOOKS
from cfl.methods.base import Method
from cfl.methods.declarations import gives
from cfl.methods.hook_guard import VMAPPED_HOOKS
from cfl.methods.hook_types import Samples
from cfl.tensors import Params, State

#: hooks that read the stacked client states (under ``vmap``, and the step hooks outside it)
_VMAPPED = tuple(dict.fromkeys((*VMAPPED_HOOKS, *STEP_HOOKS)))

StepBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # x, y, task, weight: (n, width, ...)


def padded_schedule(jobs: list[ClientJob], hp: Hyper,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """(S, C, B) sample indices and 0/1 weights (step-major, so a step's rows are contiguous), the (C, S)
    real batch sizes (CPU; 0 past a client's last step) and each client's step count; short batches are
    padded with weight 0. Built in a fixed number of operators besides the clients' shuffles (one
    ``randperm`` per client and epoch: :func:`cfl.engine.local.jobs.epoch_orders`), all on the CPU but the
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


def client_blocks(jobs: list[ClientJob], block: int) -> Iterator[tuple[int, list[ClientJob]]]:
    """The sorted ``jobs`` in blocks of ``block`` clients trained together, with each block's first position."""
    for start in range(0, len(jobs), block):
        yield start, jobs[start : start + block]


def stacked_buffers(jobs: list[ClientJob]) -> Params:
    """The clients' BatchNorm running statistics stacked ``(C, ...)`` (``{}`` for a model without any)."""
    return {k: torch.stack([job.buffers[k] for job in jobs]) for k in jobs[0].buffers}


def with_replay(data: StepBatch, extras: list[Batch | None]) -> StepBatch:
    """The step's data with each method's replay samples appended after it, per client."""
    x, y, t, w = data
    for extra in extras:
        if extra is not None:
            x, y = torch.cat([x, extra.x], 1), torch.cat([y, extra.y], 1)
            t, w = torch.cat([t, extra.task], 1), torch.cat([w, extra.weight], 1)
    return x, y, t, w


def prefix_rows(matrices: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """The first ``n`` clients' rows of stacked ``(C or 1, ...)`` tensors (a client dim of 1, shared, stays 1)."""
    return {k: v if v.shape[0] == 1 or n == v.shape[0] else v[:n] for k, v in matrices.items()}


@dataclass
class StepInputs:
    """One step's inputs for the ``n`` clients still training."""

    n: int
    data: StepBatch  # the step's own samples (n, B, ...), before replay
    draws: list[list[Samples | None]]  # per replaying method, each client's draw
    extras: list[Batch | None]  # per replaying method, the draws padded to the client with the most


@dataclass
class BatchedRound:
    """What both batched paths read of one block's round (:meth:`of`)."""

    jobs: list[ClientJob]
    index: torch.Tensor  # (S, C, B) sample indices
    weight: torch.Tensor  # (S, C, B) 0/1: padding has weight 0
    sizes: torch.Tensor  # (C, S) real batch sizes (CPU)
    client_steps: list[int]
    steps_left: torch.Tensor  # (C,) each client's step count, at least 1 (the mean loss's divisor)
    allowed: torch.Tensor | None  # (C, K) classes the loss may use, None: all
    states: list[State]  # per method, its clients' states stacked for the hooks under ``vmap``
    raw_states: list[list[State]]  # per method, each client's state as it is
    replaying: list[tuple[Method, list[State], State]]  # per replay-drawing method: its clients' states, broadcast
    generators: list[torch.Generator]  # each client's replay generator
    #: ``optimizer.state: kept``: the clients' stacked optimiser slots and step counts so far, else None
    kept: tuple[dict[str, list[torch.Tensor]], torch.Tensor] | None
    task_ids: torch.Tensor  # (C, B)
    labels: torch.Tensor  # (S, C, B): every step's labels in one operator
    x: torch.Tensor  # the task's training inputs
    x_buffer: torch.Tensor  # a step's samples are gathered here: no fresh pages each step
    augment: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor] | None  # hp.augment

    @staticmethod
    def of(global_params: Params, jobs: list[ClientJob], x: torch.Tensor, y: torch.Tensor, task: int, hp: Hyper,
           round_methods: RoundMethods, scratch: Scratch | None) -> BatchedRound:
        """The round of ``jobs`` (sorted by steps, most first); ``scratch``: the stacked path's kept buffers, where
        the steps' samples are gathered (None: a fresh buffer)."""
        device = x.device
        C = len(jobs)
        index, weight, sizes, client_steps = padded_schedule(jobs, hp, device)
        steps_left = torch.tensor([max(k, 1) for k in client_steps], dtype=torch.get_default_dtype(), device=device)
        allowed = None if jobs[0].allowed is None else torch.stack([job.allowed for job in jobs])
        cids = [job.cid for job in jobs]
        methods = round_methods.methods
        states = [_stacked_states(m, round_methods.client_states(i, cids)) for i, m in enumerate(methods)]
        replaying = [(m, round_methods.client_states(i, cids), round_methods.broadcasts[i])
                     for i, m in enumerate(methods) if gives(m, "replay")]
        generators = [replay_generator(job) for job in jobs]
        raw_states = [round_methods.client_states(i, cids) for i in range(len(round_methods.methods))]
        kept = None
        if hp.optimizer_state == "kept" and not local_optim.plain_sgd(hp):
            slots, steps = local_optim.kept_state(hp, global_params, [round_methods.optimizer.get(c) for c in cids])
            kept = ({k: [v.to(device) for v in vs] for k, vs in slots.items()}, steps.to(device))
        task_ids = torch.full((C, hp.batch_size), task, dtype=y.dtype, device=device)
        x_shape = (C * hp.batch_size, *x.shape[1:])
        x_buffer = torch.empty(x_shape, dtype=x.dtype, device=device) if scratch is None else \
            scratch.get("x", x_shape, x.dtype, device)
        labels = y[index]
        return BatchedRound(jobs, index, weight, sizes, client_steps, steps_left, allowed, states, raw_states,
                            replaying, generators, kept, task_ids, labels, x, x_buffer, hp.augment)

    @property
    def steps(self) -> int:
        """The longest client's step count."""
        return self.index.shape[0]

    def step(self, s: int) -> StepInputs:
        """Step ``s``'s inputs: the clients still training (a prefix: sorted by steps), their batch gathered into
        :attr:`x_buffer` and augmented, and the replaying methods' draws from each client's generator."""
        x = self.x
        n = sum(steps > s for steps in self.client_steps)
        rows = self.index[s, :n].reshape(-1)
        xb = torch.index_select(x, 0, rows, out=self.x_buffer[: rows.numel()]).view(n, -1, *x.shape[1:])
        yb, wb, tb = self.labels[s, :n], self.weight[s, :n], self.task_ids[:n]
        if self.augment is not None:  # per sample, over the (clients x batch) samples at once
            xb = self.augment(xb.flatten(0, 1), None).view_as(xb)
        draws = [[hooks.replayed(m, raw[c], self.generators[c], x, b) for c in range(n)]
                 for m, raw, b in self.replaying]
        return StepInputs(n, (xb, yb, tb, wb), draws, [pad_samples(d) for d in draws])

    def outcomes(self, loss_sum: torch.Tensor, finite: torch.Tensor, carries: list[dict[int, State]] | None,
                 slots: dict[str, list[torch.Tensor]] | None, client_buffers: Params) -> list[ClientOutcome]:
        """Each client's outcome: ``loss_sum`` (C,) its steps' summed task losses, ``finite`` (C,) whether all were
        finite, ``carries`` its step hooks' running values (None: no step hook carries any), ``slots`` the stacked
        optimiser state after the round (read under ``optimizer.state: kept`` only), ``client_buffers`` the
        clients' stacked running statistics."""
        mean_loss = (loss_sum / self.steps_left).tolist()
        finite_list = finite.tolist()
        kept, steps = self.kept, self.client_steps
        return [ClientOutcome(job.cid, len(job.indices), mean_loss[c], finite_list[c],
                              {} if carries is None else carries[c],
                              {} if kept is None else local_optim.stored_state(slots, kept[1][c] + steps[c], c),
                              {k: v[c] for k, v in client_buffers.items()}, steps[c])
                for c, job in enumerate(self.jobs)]


def _stacked_states(method: Method, states: list[State]) -> State:
    """The clients' states stacked for the hooks that run under ``vmap`` ({} when the method has none)."""
    if not any(takes(method, hook) for hook in _VMAPPED):
        return {}
    return stack_states(states, method.computes.ragged)
