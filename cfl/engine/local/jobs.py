"""What the round loop hands to a client trainer, and the per-client batch schedule both trainers share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from cfl.engine.hook_call import blamed, takes
from cfl.engine.hook_rules import check_client_states, check_steps
from cfl.engine.local import hooks
from cfl.methods.base import Method
from cfl.methods.declarations import gives
from cfl.records.client_states import ClientStates, MethodState
from cfl.tensors import Params, State


@dataclass
class Hyper:
    """Local-training hyperparameters (a fresh optimiser every round: :mod:`cfl.engine.local.local_optim`)."""

    lr: float
    momentum: float
    weight_decay: float
    local_epochs: int
    batch_size: int
    # the stream's train-time augmentation of a (N, *input_shape) batch (None: none); draws from torch's RNG
    augment: Callable[[torch.Tensor, torch.Generator | None], torch.Tensor] | None = None
    # batched engine: clients trained together at a time (0: auto, see local_batched.auto_client_block)
    client_block: int = 0
    # the run's training path (cfl.engine.local.path.choose_path); "": the batched trainer chooses per call
    path: str = ""
    # 32 or bf16-mixed: the products of local training in bfloat16 over float32 weights (cfl/engine/local/precision.py)
    precision: int | str = 32
    # the local optimiser: sgd (momentum above), adam or adamw (betas, eps); cfl.engine.local.local_optim
    optimizer: str = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    # fresh: each client's optimiser state starts anew every round; kept: carried per client across rounds
    optimizer_state: str = "fresh"
    # parameter-name prefix -> its own learning rate in place of ``lr`` (the longest matching prefix wins; {}: lr
    # for all): local_optim.lr_of
    lr_groups: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientJob:
    """One sampled client in one round: its sample indices into the task's training tensors."""

    cid: int
    indices: torch.Tensor  # (n_c,) long
    allowed: torch.Tensor | None  # (K,) bool: classes the loss may use (TCE / class-IL), None: all
    seed: int  # seeds this client's data order and replay draws for this round
    #: the BatchNorm running statistics the client starts from (the global ones, or under ``model.buffers: local``
    #: its own); ``{}`` for a model without any (:mod:`cfl.models.buffers`)
    buffers: Params = field(default_factory=dict)
    #: at most this many steps in each local epoch (``Method.client_start``'s steps); None: all the batches
    steps_per_epoch: int | None = None


@dataclass
class RoundMethods:
    """The run's methods with their engine-owned states and this round's broadcasts."""

    methods: list[Method]
    states: list[MethodState]
    broadcasts: list[State]
    #: ``optimizer.state: kept``: every client's optimiser state (cfl.engine.local.local_optim.stored_state), else None
    optimizer: ClientStates | None = None
    #: per client id, its starting parameters (``Method.param_roles``, ``client_start``: the sequential trainer
    #: only); None: every client starts from the global model
    starts: dict[int, dict[str, torch.Tensor]] | None = None
    #: parameters no optimiser step moves (``Method.param_roles`` frozen)
    frozen: frozenset[str] = frozenset()

    def client_states(self, i: int, cids: list[int]) -> list[State]:
        """Method ``i``'s states of the clients ``cids`` (the batched trainer's block); where its hooks under
        ``vmap`` read them stacked, tensors of differing shapes are refused, naming the method and ``client_end``
        (the hook that keeps a client state)."""
        states = [self.states[i].clients.get(c) for c in cids]
        method = self.methods[i]
        if len(states) > 1 and stacks_client_states(method):
            blamed(method, "client_end", check_client_states, states, method.computes.ragged)
        return states


def stacks_client_states(method: Method) -> bool:
    """Whether the batched trainer stacks ``method``'s client states: it overrides a hook run under ``vmap``."""
    from cfl.methods.hook_guard import STEP_HOOKS, VMAPPED_HOOKS

    return any(takes(method, hook) for hook in (*VMAPPED_HOOKS, *STEP_HOOKS))


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends only on ``parts`` (run seed, task, round, client, purpose)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> 1)


def epoch_orders(job: ClientJob, hp: Hyper) -> list[torch.Tensor]:
    """The positions (into ``job.indices``, CPU) of the samples each local epoch trains on, in order.

    Each epoch is a fresh shuffle from the client's own generator; with ``job.steps_per_epoch`` an epoch
    keeps the samples of its first that many batches."""
    gen = torch.Generator().manual_seed(job.seed)
    n = len(job.indices)
    kept = n if job.steps_per_epoch is None else min(n, job.steps_per_epoch * hp.batch_size)
    return [torch.randperm(n, generator=gen)[:kept] for _ in range(hp.local_epochs)]


def client_schedule(job: ClientJob, hp: Hyper) -> list[torch.Tensor]:
    """The client's mini-batches (index tensors) for all local epochs, in order (:func:`epoch_orders` cut
    into batches; an epoch's last batch may be short)."""
    steps = []
    for positions in epoch_orders(job, hp):
        order = job.indices[positions.to(job.indices.device)]
        steps.extend(order[i : i + hp.batch_size] for i in range(0, len(order), hp.batch_size))
    return steps


def limit_epochs(jobs: list[ClientJob], methods: list[Method], broadcasts: list[State]) -> None:
    """Set each job's ``steps_per_epoch``: the smallest ``client_start`` ``steps`` of the methods that declare it."""
    limiting = [(m, b) for m, b in zip(methods, broadcasts, strict=True) if gives(m, "steps")]
    if not limiting:
        return
    for job in jobs:
        counts = []
        for method, broadcast in limiting:
            counts.append(hooks.client_start(method, "steps", check_steps, server=broadcast,
                                             num_samples=len(job.indices)))
        job.steps_per_epoch = min((c for c in counts if c is not None), default=None)


def replay_generator(job: ClientJob) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(job.seed, 0x5E))


@dataclass
class ClientOutcome:
    """Per-client result figures of one round (the parameters come back stacked)."""

    cid: int
    num_samples: int
    #: the task loss (the steps' weighted cross-entropy, replay included), averaged over the client's steps; the
    #: same in every path: no penalty or extra loss (the stacked path never forms a penalty's value)
    mean_loss: float
    finite: bool
    #: method index -> the client's running values at the round's end (step hooks' ``carry_step``), which the
    #: round engine writes into the client's state if it keeps the client
    carry: dict[int, State] = field(default_factory=dict)
    #: ``optimizer.state: kept``: the client's optimiser state after the round, which the round engine stores if
    #: it keeps the client
    optimizer_state: State = field(default_factory=dict)
    #: the client's BatchNorm running statistics after the round (``{}`` for a model without any)
    buffers: Params = field(default_factory=dict)
    #: the local steps the client took in the round (``client_end``'s ``training.steps``)
    steps: int = 0
