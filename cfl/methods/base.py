"""The method plugin interface: optional hooks on the client and on the server.

A method is a small class with a ``Params`` dataclass and whichever hooks it needs. Client hooks are
written for ONE client: ``penalty`` and ``transform_grads`` are pure tensor functions of that client's
parameters and state, so the batched engine can ``torch.func.vmap`` them over all sampled clients while
the sequential engine calls them directly. State is owned by the engine (``MethodState``), checkpointed
with the run, and handed back to the hooks of the method that made it.

Hook order in a round (``t`` = task, 0-based):
  client: for each local step, loss = loss_fn + sum(penalty) [+ replay batch]; grads -> transform_grads
  client: ``round_payload`` (optional, after local training, e.g. FedCurv's Fisher)
  server: aggregate -> ``server_update`` (x GMA mask) -> ``transform_update`` (FOT) -> ``round_end``
At a task end:
  client: ``task_end_client`` on each participant (Fisher, memories, bases, GPSE sketches)
  server: ``task_end_server`` with the participants' payloads
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

Params = dict[str, torch.Tensor]
State = dict[str, Any]


@dataclass(frozen=True)
class NoParams:
    """A method without parameters."""


@dataclass
class MethodState:
    """Everything a method remembers: server state and one state dict per client id."""

    server: State = field(default_factory=dict)
    clients: dict[int, State] = field(default_factory=dict)

    def client(self, cid: int) -> State:
        return self.clients.setdefault(cid, {})

    def state_dict(self) -> dict[str, Any]:
        return {"server": self.server, "clients": self.clients}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.server = data["server"]
        self.clients = {int(k): v for k, v in data["clients"].items()}


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


@dataclass
class ClientData:
    """One client's local training data for one task (tensors on the run's device)."""

    x: torch.Tensor
    y: torch.Tensor
    task: int


@dataclass
class Batch:
    """A (possibly stacked over clients) batch: ``weight`` is 0 for padding samples."""

    x: torch.Tensor
    y: torch.Tensor
    task: torch.Tensor
    weight: torch.Tensor


class Method:
    """Base class: every hook is optional and defaults to doing nothing."""

    name: ClassVar[str] = "base"
    about: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    #: which clients run ``task_end_client``: "all" clients, or the "sampled" GPSE-style participants
    task_end_participants: ClassVar[str] = "all"
    #: whether ``task_end_client`` needs the task's final global model: if so each participant downloads it,
    #: counted in ``download_bytes`` and on its own line ``method_stats.<name>.task_end_model_download_bytes``
    task_end_needs_model: ClassVar[bool] = True

    def __init__(self, params: Any, run: RunInfo) -> None:
        self.p = params
        self.run = run

    @classmethod
    def check_config(cls, params: Any, cfg: Any) -> None:
        """Raise ``ConfigError`` if ``params`` cannot work with the run config ``cfg``; called when the config
        is validated, before any file is written or data loaded."""

    # ---- client side, for one client (vmapped by the batched engine) ----
    def penalty(self, params: Params, global_params: Params, broadcast: State, state: State) -> torch.Tensor | None:
        """Extra scalar loss for one client (EWC, FedProx, FedCurv). Must be a pure tensor function."""
        return None

    def penalty_gradient(self, global_params: Params, broadcast: State,
                         state: State) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
        """Override for a quadratic ``penalty``: its gradient as ``A * w - B`` per parameter, ``{name: (A, B)}``
        with tensors broadcastable to one client's parameter (names left out carry no penalty). A method
        that overrides it trains on the stacked engine path, which takes the penalty's share of each SGD
        step in one elementwise pass instead of differentiating ``penalty`` under ``vmap``. One client;
        pure, vmapped. Not overridden (None): the penalty is differentiated."""
        return None

    def batch_loss(self, params: Params, x: torch.Tensor, task: torch.Tensor, weight: torch.Tensor,
                   broadcast: State, state: State) -> torch.Tensor | None:
        """Extra scalar loss that needs the step's inputs (distillation, e.g. LwF). Pure, vmapped.

        ``x``, ``task``, ``weight``: this client's batch for the step (``weight`` 0 marks padding).
        """
        return None

    def transform_grads(self, grads: Params, state: State) -> Params:
        """Rewrite one client's gradients before the SGD step (GPM projection)."""
        return grads

    #: set True in subclasses that override ``penalty`` / ``batch_loss`` / ``transform_grads``
    has_penalty: ClassVar[bool] = False
    has_batch_loss: ClassVar[bool] = False
    has_grad_transform: ClassVar[bool] = False

    def stack_states(self, states: list[State]) -> State:
        """Stack per-client states for the batched engine (override to pad ragged tensors)."""
        if not states or not states[0]:
            return {}
        keys = [k for k, v in states[0].items() if isinstance(v, torch.Tensor)]
        return {k: torch.stack([s[k] for s in states]) for k in keys}

    def replay_batch(self, states: list[State], generators: list[torch.Generator]) -> Batch | None:
        """Optional extra samples per client for this step (ER), stacked over the given clients.

        ``generators[i]`` belongs to client i (seeded per client and round), so draws do not depend
        on which other clients train alongside. Pad with ``weight`` 0 where a client has fewer.
        """
        return None

    def round_payload(self, model: nn.Module, params: Params, data: ClientData, state: State) -> State | None:
        """After local training: what one client uploads besides its model (FedCurv).

        ``params`` are views of the round's stacked client models, whose memory the server reuses for the
        updates after this call: keep computed tensors or ``.clone()``, never the views themselves.
        """
        return None

    # ---- server side ----
    def broadcast(self, server: State) -> State:
        """Tensors sent to every sampled client with the model (counted as download bytes)."""
        return {}

    def transform_update(self, delta: Params, server: State, task: int) -> Params:
        """Rewrite the server step ``w_new - w`` before it is applied (FOT's projection).

        It runs last: after aggregation, the server optimiser (``server_update``) and GMA's mask, so a
        projection constrains the step the model actually takes.
        """
        return delta

    def server_update(self, global_params: Params, delta: Params, server: State, server_lr: float) -> Params | None:
        """Apply the update (server optimisers such as FedAdam); None: the default ``w + lr * delta``."""
        return None

    def round_end(self, payloads: dict[int, State], server: State) -> None:
        """Reduce the round's client payloads into server state (FedCurv's u, v)."""

    def task_end_client(self, model: nn.Module, params: Params, data: ClientData, state: State,
                        broadcast: State, generator: torch.Generator) -> State | None:
        """At a task end, on one participating client: update its state, return a payload for the server."""
        return None

    def task_end_broadcast(self, server: State) -> State:
        """Tensors the server sends to task-end participants (FOT's basis)."""
        return {}

    def task_end_server(self, payloads: dict[int, State], server: State, task: int) -> None:
        """At a task end, on the server: reduce the participants' payloads (GPSE)."""

    def stats(self, state: MethodState) -> dict[str, Any]:
        """Method-specific figures for ``results.json`` (``method_stats``)."""
        return {}


def overrides(method: Method, hook: str) -> bool:
    """Whether ``method``'s class replaces the base class's ``hook``."""
    return getattr(type(method), hook) is not getattr(Method, hook)
