"""The round loop over the run's plan (cfl/schedules.py, the synchronous schedule included): each global round's
client sample (cfl/engine/rounds/round_draws.py), its local training and aggregation (cfl/engine/rounds/one_round.py),
the task ends after a round at which clients switch (cfl/engine/rounds/task_end.py) and the evaluations
(cfl/engine/rounds/evaluation.py). The loop's state is a :class:`cfl.engine.rounds.run_state.RunState`.

Randomness is derived, not carried: the clients sampled in (task, round), each client's data order
and the task partitions are pure functions of the run seed, so a run is reproducible bit for bit on
CPU and can resume at any round from its checkpointed state (parameters, method states, torch RNG).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cfl.config.keys import Config
from cfl.config.lr_groups import check_prefixes
from cfl.config.schema import ConfigError
from cfl.data.stream import Stream
from cfl.engine.hook_call import call
from cfl.engine.local.batched import BatchedTrainer, client_block_line
from cfl.engine.local.jobs import ClientJob, Hyper
from cfl.engine.local.path import choose_path, trainer_kind
from cfl.engine.local.sequential import train_sequential
from cfl.engine.rounds import server_events
from cfl.engine.rounds.client_params import ClientParams
from cfl.engine.rounds.evaluation import accuracies, accuracy_of, class_accuracy, evaluate
from cfl.engine.rounds.model_buffers import announcement
from cfl.engine.rounds.one_round import ClientTraining, Trainer, run_round
from cfl.engine.rounds.round_draws import Schedule
from cfl.engine.rounds.run_state import Observer, RunState
from cfl.engine.rounds.server import Server
from cfl.engine.rounds.shared_backbone import SharedBackbone
from cfl.engine.rounds.state_stores import build_stores, sizing_of
from cfl.engine.rounds.task_end import end_tasks, task_end_draws
from cfl.engine.rounds.task_start import TaskStarts
from cfl.methods import METHODS
from cfl.methods.base import Method
from cfl.methods.hook_types import RunInfo
from cfl.metrics.asynchronous import scheduled_matrix
from cfl.metrics.matrix import empty_matrix
from cfl.models import ModelShape, run_model
from cfl.models.buffers import load_global_model, running_stats
from cfl.models.layers import protected_layers
from cfl.records.client_states import ClientStates, MethodState
from cfl.records.comm import CommLedger
from cfl.records.snapshot import Progress, RunSnapshot
from cfl.schedules import build_plan
from cfl.tensors import Params, nbytes

TRAINERS: dict[str, Callable[[], Trainer]] = {  # a fresh trainer per runner
    "batched": BatchedTrainer, "sequential": lambda: train_sequential}

__all__ = ["Observer", "Runner", "built"]


class Runner:
    """Owns the global model, the method states and the metrics of one run."""

    def __init__(self, cfg: Config, stream: Stream, observers: list[Observer] | None = None,
                 device: torch.device | str = "cpu", state_dir: Path | None = None) -> None:
        """``state_dir``: where a disk client-state store keeps its files (``cfl run``: the run directory's
        ``client_states/``; None: a temporary directory deleted with the runner)."""
        self.cfg, self.stream, self.device = cfg, stream, torch.device(device)
        torch.manual_seed(cfg.seed)
        shape = ModelShape(stream.input_shape, stream.classes_per_head, stream.num_tasks, stream.scenario == "task",
                           cfg.clients_per_round)
        self.model: nn.Module = run_model(cfg, stream, shape).to(self.device)
        self.run_info = RunInfo(stream.num_tasks, stream.scenario, cfg.num_clients, cfg.clients_per_round,
                                cfg.seed, self.model, protected_layers(self.model), stream.name,
                                cfg.batch_size, tuple(stream.input_shape), stream.classes_per_head,
                                task_classes=tuple(tuple(int(c) for c in t.classes) for t in stream.tasks),
                                schedule=cfg.schedule.name)
        specs = [cfg.method, *cfg.plugins]
        self.methods: list[Method] = [built(METHODS[s["name"]], self._hparams_of(s), self.run_info) for s in specs]
        sizing = sizing_of(cfg, stream, self.model, self.run_info.protected)
        self.client_stores = build_stores(cfg, sizing, self.methods, state_dir, self.device)
        self.state_store, self.state_estimate = self.client_stores.kind, self.client_stores.estimates
        self.server = Server(cfg, {k: v.detach().clone() for k, v in self.model.named_parameters()}, self.methods,
                             [MethodState(clients=s) for s in self.client_stores.stores],
                             running_stats(self.model))
        # server state before round 1 (SCAFFOLD's c), and the initial values a method sets (CODA-P's components)
        self.params = server_events.at_start(self.methods, self.states, self.params)
        # model.buffers: local (FedBN): each client's own BatchNorm running statistics between its rounds
        buffer_states = ClientStates() if cfg.model.buffers == "local" and self.buffers else None
        self.initial_buffers = {k: v.clone() for k, v in self.buffers.items()}  # a local client's first start
        self.shared_backbone = SharedBackbone(self.model, self.buffers)  # what server_event('task_end') may change
        self.plan = build_plan(cfg, stream.num_tasks)  # the client x round grid (cfl/schedules.py)
        self.schedule = Schedule(cfg, stream, self.plan, self.device)  # checks the clients' shares before any round
        # each client's own task starts, and a resend after a task end changed them
        self.task_starts = TaskStarts(self.methods, self.schedule.sampled, self.plan.task_start,
                                      lambda: self.progress.task_start_changes)
        for m in self.methods:  # a task end's own draw among the clients of the first task (clients_join_per_task)
            if m.task_end_clients and m.task_end_clients > self.schedule.joined(0):
                raise ConfigError(f"method {m.name} draws {m.task_end_clients} clients at each task end, but the first "
                                  f"task has {self.schedule.joined(0)} (clients_join_per_task: "
                                  f"{cfg.clients_join_per_task}); raise num_clients or lower clients_join_per_task")
        self.hyper = Hyper(cfg.lr, cfg.momentum, cfg.weight_decay, cfg.local_epochs, cfg.batch_size,
                           augment=stream.augment, client_block=cfg.client_block, precision=cfg.precision,
                           optimizer=cfg.optimizer.name, betas=tuple(cfg.optimizer.betas), eps=cfg.optimizer.eps,
                           optimizer_state=cfg.optimizer.state, lr_groups=dict(cfg.lr_groups))
        # lr_groups: every prefix names parameters of this model (refused before any round)
        check_prefixes(cfg.lr_groups, self.params, type(self.model).__name__)
        # optimizer.state: kept: each client's optimiser state between its rounds (checkpointed with the run)
        self.optimizer_states = ClientStates() if cfg.optimizer.state == "kept" else None
        self.client_params = ClientParams(self.methods, list(self.params))
        self.engine_path = choose_path(self.model, self.hyper, self.methods, cfg.client_execution)
        self.hyper.path = self.engine_path.path
        self.engine_path.announce()  # once per run, on stderr; results.json keeps it as engine_path
        if self.engine_path.path != "sequential" and cfg.backend == "local" and \
                (line := client_block_line(self.model, self.device, cfg.clients_per_round, cfg.client_block)):
            print(line, file=sys.stderr)
        if self.buffers:
            print(announcement(self.buffers, cfg.model.buffers), file=sys.stderr)
        self.model_bytes = nbytes(self.client_params.shared(self.params))  # the local parameters are never sent
        self.state = RunState(cfg, stream, self.device, self.model, self.methods, self.server, self.plan,
                              self.schedule, self.task_starts, self.shared_backbone, self.client_params, CommLedger(),
                              Progress(acc_matrix=empty_matrix(stream.num_tasks)), self.model_bytes,
                              buffer_states, task_end_draws(self.plan, self.methods, cfg.seed),
                              observers or [])
        self.should_stop: Callable[[], bool] = lambda: False
        self.after_round: Callable[[], None] = lambda: None
        trainer = trainer_kind(cfg.client_execution, self.engine_path.path)
        self.trainer: Trainer = TRAINERS[trainer]()
        if cfg.backend == "ray":  # groups of clients on Ray workers (cfl/engine/local/ray_backend.py)
            from cfl.engine.local.ray_backend import RayClients

            self.trainer = RayClients(cfg, self.engine_path.path)

    @staticmethod
    def _hparams_of(spec: dict[str, Any]) -> Any:
        cls = METHODS[spec["name"]].Hyperparams
        return cls(**{k: v for k, v in spec.items() if k != "name"})

    @property
    def params(self) -> Params:
        """The global model's parameters (held by the server)."""
        return self.server.params

    @params.setter
    def params(self, params: Params) -> None:
        self.server.params = params

    @property
    def buffers(self) -> Params:
        """The global model's BatchNorm running statistics (held by the server; ``{}`` for a model without any)."""
        return self.server.buffers

    @buffers.setter
    def buffers(self, buffers: Params) -> None:
        self.server.buffers = buffers
        load_global_model(self.model, {}, buffers)  # the hooks' functional_call(model, params) reads them

    @property
    def progress(self) -> Progress:
        """The run's progress (rounds done, evaluations, accuracy matrix; checkpointed)."""
        return self.state.progress

    @progress.setter
    def progress(self, progress: Progress) -> None:
        self.state.progress = progress

    @property
    def comm(self) -> CommLedger:
        """The run's ledger of bytes sent (checkpointed)."""
        return self.state.comm

    @comm.setter
    def comm(self, comm: CommLedger) -> None:
        self.state.comm = comm

    @property
    def buffer_states(self) -> ClientStates | None:
        """``model.buffers: local``: each client's own running statistics between its rounds (else None)."""
        return self.state.buffer_states

    @buffer_states.setter
    def buffer_states(self, states: ClientStates | None) -> None:
        self.state.buffer_states = states

    @property
    def observers(self) -> list[Observer]:
        return self.state.observers

    @observers.setter
    def observers(self, observers: list[Observer]) -> None:
        self.state.observers = observers

    @property
    def states(self) -> list[MethodState]:
        """The methods' server and per-client states (held by the server, read by the clients' hooks)."""
        return self.server.states

    @states.setter
    def states(self, states: list[MethodState]) -> None:
        self.server.states = states

    def snapshot(self) -> RunSnapshot:
        """The run's state now (references, not copies), for checkpoints and ``results.json``."""
        return RunSnapshot(self.cfg, self.stream, self.device, self.params, self.methods, self.states, self.comm,
                           self.progress, self.model_bytes, self.engine_path.as_dict(), self.optimizer_states,
                           self.buffers, self.buffer_states, self.shared_backbone.changed)

    def resume(self, run: RunSnapshot) -> None:
        """Continue from ``run``, a snapshot of this runner put back into a checkpointed state
        (:func:`cfl.engine.stores.checkpoint.restore`)."""
        if run.states is not self.states or run.comm is not self.comm:
            raise ValueError("Runner.resume takes a snapshot of this runner (checkpoint.restore(runner.snapshot(), "
                             "payload))")
        self.params, self.progress, self.buffers = run.params, run.progress, run.buffers
        try:
            self.shared_backbone.load(run.backbone)
        except ValueError as err:
            raise ConfigError(f"--resume: {err}; start a new run with --out") from None

    # ---- one round ----
    def run_round(self, task: int, rnd: int, groups: list[tuple[int, list[ClientJob]]] | None = None) -> dict[str, Any]:
        """One round of ``task`` (the server's; under a schedule, the newest any client holds), ``rnd`` as the loop
        names it (:meth:`Schedule.global_round`: the synchronous plan's round of the task, else the global round):
        ``groups``, each task's sampled clients (None: the schedule's of that round). cfl/engine/rounds/one_round.py."""
        groups = groups or self.schedule.groups(self.schedule.global_round(task, rnd))
        local = ClientTraining(self.trainer, self.hyper, self.optimizer_states, self.initial_buffers)
        return run_round(self.state, local, task, rnd, groups)

    # ---- task boundaries and evaluation ----
    def evaluate(self, upto: int) -> list[float]:
        """Each of tasks 0..upto's accuracy (class-incremental: masked to their classes)."""
        tasks = list(range(upto + 1))
        return accuracies(self.state, tasks, self.schedule.class_mask(tasks))

    @property
    def measures_forward_transfer(self) -> bool:
        """Not in class-incremental runs: before training task i the model may answer only the classes seen so
        far, none of task i's, so GEM's ``a[i-1][i]`` would be 0 by construction."""
        return self.stream.scenario != "class"

    def task_end(self, task: int) -> None:
        """The task ends after ``task``'s last round under the synchronous plan (:func:`end_tasks`)."""
        rnd = self.schedule.global_round(task, self.cfg.rounds_per_task - 1)
        end_tasks(self.state, rnd, self.plan.switches().get(rnd, []),
                  [t for t, r in self.plan.last_left().items() if r == rnd])

    # ---- the loop ----
    def run(self) -> Progress:
        """Train from the current progress to the plan's last round (or until ``should_stop``). After a round at
        which clients switch: the task ends and an evaluation; also every ``eval_every`` rounds (the synchronous
        plan: of the task) and after the last round. The synchronous plan tells a task's last round before its
        final evaluation and task end, and fills the accuracy matrix row by row; any other plan ends the tasks
        before the evaluation and makes the matrix from the evaluations at the end (cfl/metrics/asynchronous.py)."""
        cfg, prog, plan, run = self.cfg, self.progress, self.plan, self.state
        sync = plan.synchronous
        started = time.perf_counter() - prog.wall_seconds
        if self.measures_forward_transfer and prog.global_round == 0 and not prog.acc_init:  # GEM's b_i
            prog.acc_init = [accuracy_of(run, j) for j in range(self.stream.num_tasks)]
        switches, leaving_at = plan.switches(), {}
        starting_at: dict[int, list[int]] = {}  # 0-based round -> the tasks first started at it (after round 0)
        for j, first in plan.first_started().items():
            if first > 0:
                starting_at.setdefault(first, []).append(j)
        for task, rnd in plan.last_left().items():
            leaving_at.setdefault(rnd, []).append(task)
        while prog.global_round < plan.rounds:
            round_started = time.perf_counter()
            rnd = prog.global_round
            task = self.schedule.newest_task(rnd)
            record = self.run_round(task, prog.round_in_task if sync else rnd)
            prog.global_round += 1
            if sync:
                prog.round_in_task += 1
            last = prog.global_round == plan.rounds
            switched, leaving = switches.get(rnd, []), leaving_at.get(rnd, [])
            ends = bool(switched) or last
            told_first = sync and ends  # the round told before the task's final evaluation and task end
            periodic = cfg.eval_every and (prog.round_in_task if sync else prog.global_round) % cfg.eval_every == 0
            if switched and not sync:
                self._end_tasks(rnd, switched, leaving)
            if not sync and self.measures_forward_transfer:  # the model a task first started next round starts from
                for j in starting_at.get(prog.global_round, []):
                    prog.acc_before_task.setdefault(str(j), accuracy_of(run, j))
            if (ends or periodic) and not told_first:
                evaluation = evaluate(run, rnd, switched, final=ends)
                record["mean_acc"] = evaluation["mean_acc"]
                run.emit("evaluation", evaluation)
            prog.wall_seconds = time.perf_counter() - started
            # timings (metrics.jsonl only; never in results or checkpoints): the round with the evaluation made in
            # it before its line, and the run's wall time so far (a resumed run's earlier part included)
            record["seconds"] = time.perf_counter() - round_started
            record["wall_seconds"] = prog.wall_seconds
            run.emit("round_end", record)
            if told_first:
                evaluation = evaluate(run, rnd, switched, final=True)
                prog.acc_matrix[task] = [evaluation["acc"].get(str(j)) for j in range(self.stream.num_tasks)]
                if self.stream.scenario == "class":
                    prog.class_acc = class_accuracy(run, task)
                run.emit("evaluation", evaluation)
                if switched:
                    self._end_tasks(rnd, switched, leaving)
                    if self.measures_forward_transfer:  # the model the next task starts from
                        prog.acc_before_task[str(task + 1)] = accuracy_of(run, task + 1)
                prog.round_in_task = 0
                prog.wall_seconds = time.perf_counter() - started
                run.emit("task_end", task, evaluation)
            if last:
                prog.task = self.stream.num_tasks
            if last and not sync:
                prog.acc_matrix = scheduled_matrix(prog.evaluations, plan, cfg.schedule.forgetting)
                if self.stream.scenario == "class":
                    prog.class_acc = class_accuracy(run, self.stream.num_tasks - 1)
                run.emit("task_end", task, prog.evaluations[-1])
            self.after_round()
            if not last and self.should_stop():
                return prog
        return prog

    def _end_tasks(self, rnd: int, switched: list[tuple[int, int]], leaving: list[int]) -> None:
        """The task ends after global round ``rnd``; ``progress.task``: the tasks all of whose holders have left."""
        end_tasks(self.state, rnd, switched, leaving)
        self.progress.task = sum(1 for r in self.plan.last_left().values() if r <= rnd)


def built(cls: type[Method], hparams: Any, run_info: RunInfo) -> Method:
    """``cls(hparams, run_info)``; what its ``__init__`` raises names the method and its file."""
    return call(cls, "__init__", hparams, run_info)
