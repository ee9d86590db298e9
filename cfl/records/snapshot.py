"""What a run has accumulated, as one typed value: checkpoints and ``results.json`` are built from it.

:class:`RunSnapshot` holds references, not copies (tensors and states are shared with the runner), so
taking one is free; it is read right away (:func:`cfl.engine.stores.checkpoint.capture`,
:func:`cfl.metrics.results.build_results`) or handed back to the runner after a restore.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from cfl.config.keys import Config
from cfl.data.stream import Stream
from cfl.methods.base import Method
from cfl.records.client_states import ClientStates, MethodState
from cfl.records.comm import CommLedger
from cfl.tensors import Params

#: ``a[i][j]``: the test accuracy (%) on task j after training task i (``None`` for j > i).
Matrix = list[list[Optional[float]]]


@dataclass
class Progress:
    """Where the run is and what it has measured so far (all of it checkpointable)."""

    task: int = 0
    round_in_task: int = 0  # rounds of `task` already done
    global_round: int = 0
    acc_matrix: Matrix = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    client_forgetting: list[dict[str, Any]] = field(default_factory=list)  # TCE paper's F_ki per measured round
    # forward transfer (not in class-incremental runs): the initial model's accuracy per task, and per task i >= 1
    # the accuracy on task i of the model before training it ({str(i): %}); empty when not measured
    acc_init: list[float] = field(default_factory=list)
    acc_before_task: dict[str, float] = field(default_factory=dict)
    # class-incremental: the accuracy per seen class ({str(class id): %}) after the last finished task
    class_acc: dict[str, float] = field(default_factory=dict)
    # under a schedule: per method index, the first global rounds (0-based) after each task end that changed its
    # "task_start" keys (cfl/engine/rounds/task_start.py: the clients are sent them again)
    task_start_changes: dict[str, list[int]] = field(default_factory=dict)
    # the changes a method made to the shared frozen backbone ({task, method, tensors, values, bytes} each;
    # cfl/engine/rounds/shared_backbone.py), and per client (str id) how many of them it has downloaded
    backbone_changes: list[dict[str, Any]] = field(default_factory=list)
    backbone_versions: dict[str, int] = field(default_factory=dict)
    train_seconds: float = 0.0
    task_end_seconds: float = 0.0
    wall_seconds: float = 0.0
    # the global round of the checkpoint each resume of the run started from, in order ([]: never resumed)
    resumed_after_rounds: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RunSnapshot:
    """The state of one run at a round boundary: config, stream, global parameters, methods and their
    states, communication ledger and progress (``model_bytes``: bytes of one global model; ``engine_path``:
    the training path the run takes and why, :class:`cfl.engine.local.path.EnginePath`)."""

    cfg: Config
    stream: Stream
    device: torch.device
    params: Params
    methods: list[Method]
    states: list[MethodState]
    comm: CommLedger
    progress: Progress
    model_bytes: int
    engine_path: dict[str, str] = field(default_factory=dict)
    #: ``optimizer.state: kept``: every client's optimiser state between its rounds, else None
    optimizer_states: ClientStates | None = None
    #: the global model's BatchNorm running statistics ({} without any), and under ``model.buffers: local`` every
    #: client's own (else None)
    buffers: Params = field(default_factory=dict)
    buffer_states: ClientStates | None = None
    #: the tensors of the shared frozen backbone a method has changed (``ServerChange.backbone``; {} none)
    backbone: Params = field(default_factory=dict)
