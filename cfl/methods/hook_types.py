"""The values a method's hooks receive and return (``docs/plugins.md``): the events of ``client_end`` and
``server_event``, the penalty terms (:class:`Quadratic`, :class:`Linear`), samples (:class:`Samples`), one local
step as the step hooks see it (:class:`Step`), a round's training (:class:`LocalTraining`), the run's facts
(:class:`RunInfo`, :class:`StateSizing`), a client's data (:class:`ClientData`) and a change of the shared
backbone (:class:`BackboneUpdate`). The hooks themselves are :class:`cfl.methods.base.Method`'s, which hands
these names on too (``from cfl.methods.base import Quadratic`` keeps working).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from cfl.config.lr_groups import lr_of as group_lr
from cfl.tensors import Params, State

#: the events of ``client_end``: a round's end, a task's end
Event = Literal["round", "task_end"]
EVENTS: tuple[Event, ...] = ("round", "task_end")


@dataclass(frozen=True)
class NoHyperparams:
    """A method without hyperparameters."""


@dataclass
class Quadratic:
    """The penalty ``weight / 2 * (w - anchor)^2`` on one parameter, summed over its entries; ``weight`` is a
    number or a tensor that broadcasts against the parameter. Its gradient is ``weight * w - weight * anchor``."""

    weight: torch.Tensor | float
    anchor: torch.Tensor
    #: an optional linear coefficient ``c`` (shaped like the parameter): the penalty adds ``<c, w>``, its gradient
    #: ``c`` (FedDyn's ``-<grad L_k(w_k^{t-1}), w>``); the stacked path fuses it into each layer's step
    linear: torch.Tensor | None = None


@dataclass
class BackboneUpdate:
    """A change of the shared frozen backbone (``ServerChange.backbone``, at ``server_event("task_end")``):
    ``deltas`` added into the SHARED frozen backbone (``{buffer name: delta}``, each shaped like the frozen tensor;
    the engine adds it once, in the tensor's dtype, to the one backbone every client runs), and ``params``: new
    global values of some parameters (``{name: tensor}``, each shaped and typed like it), e.g. the adapter
    re-initialised on top of the changed backbone."""

    deltas: Params
    params: Params = field(default_factory=dict)


@dataclass
class Linear:
    """The penalty ``<coef, w>`` on one parameter (gradient ``coef``, a tensor shaped like it): SCAFFOLD's
    correction ``<c - c_i, w>``. The stacked path fuses it into each layer's step, as a :class:`Quadratic`."""

    coef: torch.Tensor


@dataclass
class Samples:
    """Samples of one client for one step (``samples``' replay and step parts): inputs, labels, task ids; ``weight``
    (what the engine hands to step hooks) is 1 for a real sample and 0 for padding (None: all real); ``extra``
    named per-sample tensors ``(n, ...)`` carried with them (DER++'s stored logits), padded with zeros like ``x``
    (step draws only: replay samples join a batch that has none)."""

    x: torch.Tensor
    y: torch.Tensor
    task: torch.Tensor
    weight: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Step:
    """One local step of one client, as the step hooks see it (``docs/plugins.md``, "Step hooks").

    ``grads`` is the gradient of the step's loss (cross-entropy on the batch and replay samples, every method's
    extra loss and penalties) at ``params``, before the optimiser adds weight decay, projects (GPM) and steps.
    ``gradient(x, y, task, weight=None)`` is the gradient of the weighted mean cross-entropy on other samples
    (e.g. the client's memory) at ``params``: the same model, heads and precision as the step. Under the
    batched engine every field is one client's slice: write one client's tensor code, with no Python branch on
    a tensor's value (use ``torch.where``)."""

    params: Params  # the client's parameters before the step
    grads: Params  # the step's gradient (see above)
    x: torch.Tensor  # the step's inputs, replay samples appended
    y: torch.Tensor
    task: torch.Tensor
    weight: torch.Tensor  # 1 per real sample, 0 for padding
    samples: Samples | None  # this method's step draw (``samples``, weight 0 marks padding), or None
    global_params: Params  # the round's global model
    server: State  # the method's broadcast of the round
    state: State  # the client's state as the round began (read only during the round)
    carry: State  # the running values: ``client_start``'s carry, then each ``carry_step``'s result
    lr: float  # the top-level ``lr``, also where ``lr_groups`` gives some parameters their own
    index: int  # the client's step number in the round, from 0
    gradient: Callable[..., Params]
    #: the client's own random numbers for this hook call (:class:`cfl.ops.counter_random.StepRandom`: ``uniform``,
    #: ``integers``), usable under ``vmap``; deterministic from the run seed, the client, the round, the step
    random: Any = None
    #: ``carry_step`` only: ``new params - params``, the optimiser's actual update of the step (None before it)
    moved: Params | None = None


@dataclass
class LocalTraining:
    """What ``client_end("round")`` gets beside the trained parameters (``training``): the round's global model the
    client started from, the local steps it took and the learning rate (the top-level ``lr``; :meth:`lr_of` a
    parameter's own, where ``lr_groups`` gives it one)."""

    global_params: Params
    steps: int
    lr: float
    #: ``lr_groups``: parameter-name prefix -> its learning rate (the longest matching prefix wins; {}: lr for all)
    lr_groups: dict[str, float] = field(default_factory=dict)

    def lr_of(self, name: str) -> float:
        """Parameter ``name``'s learning rate: its longest matching ``lr_groups`` prefix's, else :attr:`lr`."""
        return group_lr(self.lr, self.lr_groups, name)


@dataclass
class RunInfo:
    """Static facts about the run that methods may read."""

    num_tasks: int
    scenario: str  # domain, task or class
    num_clients: int
    clients_per_round: int
    seed: int
    model: nn.Module  # a template module (parameters are not the live global model)
    protected: dict[str, str] = field(default_factory=dict)  # param name -> "linear" | "conv"
    stream_name: str = ""
    batch_size: int = 0  # the local mini-batch size of the run
    input_shape: tuple[int, ...] = ()  # one input's shape, e.g. (1, 28, 28) (a server-side generator's images)
    num_classes: int = 0  # the logits' width: classes per head (class-incremental: all the stream's classes)
    #: each task's global class ids, in task order (the stream's ``Task.classes``; class-incremental: the head's
    #: columns): the classes a task end adds to a client's old classes (FediCaRL's distillation)
    task_classes: tuple[tuple[int, ...], ...] = ()
    schedule: str = "synchronous"  # the run's schedule.name (cfl/schedules.py)


@dataclass(frozen=True)
class StateSizing:
    """What a method's estimate of its clients' state may depend on (``Method.count_bytes("client_state")``)."""

    model_bytes: int  # one global model's parameters
    sample_bytes: int  # one training input
    samples_per_client: float  # mean training samples of a client in one task
    num_clients: int
    num_tasks: int
    rounds: int  # rounds of the whole run
    clients_per_round: int
    protected: dict[str, tuple[str, int]]  # protected layer -> ("linear" | "conv", input width d of its im2col view)
    num_classes: int = 0  # the logits' width: classes per head (class-incremental: all the stream's classes)


class ClientData:
    """One client's training data of one task; with ``rows`` the samples are gathered from ``x``, ``y`` on
    first access, so a hook that never reads them costs nothing."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, task: int, rows: torch.Tensor | None = None) -> None:
        self._x, self._y, self._rows, self.task = x, y, rows, task

    def _gather(self) -> None:
        if self._rows is not None:
            self._x, self._y, self._rows = self._x[self._rows], self._y[self._rows], None

    @property
    def x(self) -> torch.Tensor:
        self._gather()
        return self._x

    @property
    def y(self) -> torch.Tensor:
        self._gather()
        return self._y
