"""The server side's hooks' values (``docs/plugins.md``): one server moment as :meth:`Method.server_event` sees it
(:class:`ServerEvent`, its kind a :data:`ServerMoment`) and what it may change (:class:`ServerChange`); the server
step's contexts of :meth:`Method.server_update` (:class:`ServerUpdate`) and :meth:`Method.transform_update`
(:class:`TransformUpdate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from cfl.methods.hook_types import BackboneUpdate
from cfl.tensors import Params, State

#: the server's moments (:attr:`ServerEvent.event`): "start", once before the first round (not again on resume);
#: "round", after each round's server step; "before_task_end", at a task end before the task-end broadcast and the
#: clients' task ends; "task_end", with the clients' task-end uploads
ServerMoment = Literal["start", "round", "before_task_end", "task_end"]
SERVER_EVENTS: tuple[ServerMoment, ...] = ("start", "round", "before_task_end", "task_end")


@dataclass
class ServerEvent:
    """One server moment of one method (``event``). ``server``: the method's server state, changed in place (kept
    only tensors, numbers, strings and lists/dicts of them: it is checkpointed); ``task``: the task (0 at
    "start"); ``global_params``: the global model, read-only ("start": a copy of the initial model); ``uploads``:
    client id -> what its ``client_end`` returned ("round": this round's kept clients; "task_end": the task-end
    participants', or for a ``server_task_end: last_holder`` method every one held for the task); ``model``:
    "round": the run's template in eval mode (its own parameters are not the global ones: ``functional_call``
    it with ``global_params``), "before_task_end": a copy holding the global parameters in eval mode (the method
    may keep or change it), "task_end": such a copy for a method that declares ``changes_backbone``, else None;
    ``classes``: at "before_task_end", the class ids of the finished tasks (long, sorted), else None."""

    event: ServerMoment
    server: State
    task: int
    global_params: Params
    uploads: dict[int, State] = field(default_factory=dict)
    model: nn.Module | None = None
    classes: torch.Tensor | None = None


@dataclass
class ServerChange:
    """What :meth:`Method.server_event` may return at "start", "round" and "task_end" (None: nothing changes):
    ``params``, new global values of some parameters (``{name: tensor}``, each shaped and typed like it: a
    closed-form classifier; at "start", the initial model's: CODA-P's first task's components); ``backbone``, at
    "task_end" only, a change of the shared frozen backbone (a method declaring ``changes_backbone``)."""

    params: Params = field(default_factory=dict)
    backbone: BackboneUpdate | None = None


@dataclass
class ServerUpdate:
    """The server optimiser's step (:meth:`Method.server_update`): ``delta``, the aggregated client update, at
    ``global_params`` (both read-only), ``server`` the method's server state (changed in place), ``server_lr`` the
    run's ``server_lr``."""

    global_params: Params
    delta: Params
    server: State
    server_lr: float


@dataclass
class TransformUpdate:
    """The server step ``w_new - w`` to rewrite (:meth:`Method.transform_update`): ``delta``, read-only, ``server``
    the method's server state, ``task`` the round's task."""

    delta: Params
    server: State
    task: int
