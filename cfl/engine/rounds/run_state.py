"""The round loop's state (cfl/engine/rounds/runner.py ``Runner.run``): what one round
(cfl/engine/rounds/one_round.py), the task ends (cfl/engine/rounds/task_end.py), the evaluations
(cfl/engine/rounds/evaluation.py) and a client's end hook (cfl/engine/rounds/client_end.py) read and write, as one
typed object passed to them; none of them sees the runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from torch import nn

from cfl.config.keys import Config
from cfl.data.stream import Stream
from cfl.engine.rounds.client_params import ClientParams
from cfl.engine.rounds.model_buffers import download_bytes
from cfl.engine.rounds.round_draws import Schedule
from cfl.engine.rounds.server import Server
from cfl.engine.rounds.shared_backbone import SharedBackbone
from cfl.engine.rounds.task_start import TaskStarts
from cfl.methods.base import Method
from cfl.records.client_states import ClientStates, MethodState
from cfl.records.comm import CommLedger
from cfl.records.snapshot import Progress
from cfl.schedules import Plan
from cfl.tensors import Params


class Observer(Protocol):
    """What the runner tells the outside world (progress bars, JSON lines, W&B)."""

    def round_end(self, record: dict[str, Any]) -> None: ...
    def evaluation(self, record: dict[str, Any]) -> None: ...
    def task_end(self, task: int, record: dict[str, Any]) -> None: ...


@dataclass
class RunState:
    """One run's model, methods, server, schedule and records, as the round loop holds them."""

    cfg: Config
    stream: Stream
    device: torch.device
    model: nn.Module  # the template every hook's functional_call runs
    methods: list[Method]
    server: Server  # the global parameters and buffers, the methods' states
    plan: Plan
    schedule: Schedule
    task_starts: TaskStarts
    shared_backbone: SharedBackbone
    client_params: ClientParams
    comm: CommLedger
    progress: Progress
    model_bytes: int  # the global model's shared parameters, sent to one client
    buffer_states: ClientStates | None  # model.buffers: local: each client's own running statistics
    #: (method index, task) -> the clients a method that draws its own task-end clients takes among the finishers
    task_end_draws: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    observers: list[Observer] = field(default_factory=list)

    @property
    def params(self) -> Params:
        return self.server.params

    @params.setter
    def params(self, params: Params) -> None:
        self.server.params = params

    @property
    def buffers(self) -> Params:
        return self.server.buffers

    @property
    def states(self) -> list[MethodState]:
        return self.server.states

    @property
    def global_tensors(self) -> Params:
        """The global parameters and buffers in one dict, for ``functional_call`` (evaluation)."""
        return {**self.params, **self.buffers} if self.buffers else self.params

    def evaluated(self) -> Iterable[Params]:
        """The models evaluation averages over (the global one, or each client's own)."""
        if not self.client_params.local_names:
            return [self.global_tensors]
        return ({**p, **self.buffers} for p in self.client_params.evaluated(self.params, self.states))

    @property
    def model_download_bytes(self) -> int:
        """Bytes of the global model sent to one client: its parameters, and its buffers where they are sent."""
        return self.model_bytes + download_bytes(self.buffers, self.buffer_states)

    def emit(self, kind: Literal["round_end", "evaluation", "task_end"], *args: Any) -> None:
        """Tell every observer."""
        for obs in self.observers:
            getattr(obs, kind)(*args)
