"""The round loop: tasks x rounds, client sampling, local training, aggregation, task boundaries.

Randomness is derived, not carried: the clients sampled in (task, round), each client's data order
and the task partitions are pure functions of the run seed, so a run is reproducible bit for bit on
CPU and can resume at any round from its checkpointed state (parameters, method states, torch RNG).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from cfl.config import Config
from cfl.data.partition import check_sizes, partition
from cfl.data.stream import Stream
from cfl.engine.evaluate import accuracy
from cfl.engine.jobs import ClientJob, ClientOutcome, Hyper, Plugins, derive_seed
from cfl.engine.local_batched import BatchedTrainer
from cfl.engine.local_sequential import train_sequential
from cfl.methods import METHODS
from cfl.methods.base import ClientData, Method, MethodState, Params, RunInfo, overrides
from cfl.metrics import client_forgetting
from cfl.metrics.comm import CommLedger, nbytes, task_end_model_line
from cfl.metrics.matrix import Matrix, empty_matrix
from cfl.models import ModelShape, build_model
from cfl.models.layers import protected_layers
from cfl.ops.aggregate import aggregate

TRAINERS: dict[str, Callable[[], Callable[..., Any]]] = {  # a fresh trainer per runner
    "batched": BatchedTrainer, "sequential": lambda: train_sequential}


class NonFiniteError(RuntimeError):
    """A client produced a NaN/inf loss or update."""


class Observer(Protocol):
    """What the runner tells the outside world (progress bars, JSON lines, W&B)."""

    def round_end(self, record: dict[str, Any]) -> None: ...
    def evaluation(self, record: dict[str, Any]) -> None: ...
    def task_end(self, task: int, record: dict[str, Any]) -> None: ...


@dataclass
class Progress:
    """Where the run is and what it has measured so far (all of it checkpointable)."""

    task: int = 0
    round_in_task: int = 0  # rounds of `task` already done
    global_round: int = 0
    acc_matrix: Matrix = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    client_forgetting: list[dict[str, Any]] = field(default_factory=list)  # TCE paper's F_ki per measured round
    train_seconds: float = 0.0
    task_end_seconds: float = 0.0
    wall_seconds: float = 0.0


def client_deltas(trained: Params, global_params: Params, keep: torch.Tensor) -> Params:
    """The kept clients' updates ``w_c - w``, computed in place in ``trained`` when every client is kept
    (no fresh (C, ...) tensors: at 64 MLP clients each costs ~160 MB of new pages a round)."""
    if bool(keep.all()):
        return {k: trained[k].sub_(v) for k, v in global_params.items()}
    return {k: trained[k][keep] - v for k, v in global_params.items()}


def sample_clients(seed: int, task: int, rnd: int, num_clients: int, k: int) -> list[int]:
    """The clients of (task, round): k of num_clients without replacement, sorted."""
    rng = np.random.default_rng(derive_seed(seed, task, rnd, 0xC11E))
    return sorted(int(c) for c in rng.choice(num_clients, size=k, replace=False))


class Runner:
    """Owns the global model, the method states and the metrics of one run."""

    def __init__(self, cfg: Config, stream: Stream, observers: list[Observer] | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.cfg, self.stream, self.device = cfg, stream, torch.device(device)
        self.observers = observers or []
        torch.manual_seed(cfg.seed)
        shape = ModelShape(stream.input_shape, stream.classes_per_head, stream.num_tasks, stream.scenario == "task")
        self.model: nn.Module = build_model(cfg.model.name if cfg.model.name != "auto" else stream.default_model,
                                            shape).to(self.device)
        self.params: Params = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        self.run_info = RunInfo(stream.num_tasks, stream.scenario, cfg.num_clients, cfg.clients_per_round,
                                cfg.seed, self.model, protected_layers(self.model), stream.name,
                                cfg.batch_size)
        specs = [cfg.method, *cfg.plugins]
        self.methods: list[Method] = [METHODS[s["name"]](self._params_of(s), self.run_info) for s in specs]
        self.states = [MethodState() for _ in self.methods]
        self.comm = CommLedger()
        self.progress = Progress(acc_matrix=empty_matrix(stream.num_tasks))
        check_sizes(cfg.partition.name, {t: len(task.train_y) for t, task in enumerate(stream.tasks)},
                    cfg.num_clients, shards_per_client=cfg.partition.shards_per_client)  # before any round
        self.hyper = Hyper(cfg.lr, cfg.momentum, cfg.weight_decay, cfg.local_epochs, cfg.batch_size,
                           augment=stream.augment, client_block=cfg.client_block)
        self.model_bytes = nbytes(self.params)
        self._partitions: dict[int, list[torch.Tensor]] = {}
        self.should_stop: Callable[[], bool] = lambda: False
        self.after_round: Callable[[], None] = lambda: None
        self.trainer: Callable[..., tuple[Params, list[ClientOutcome]]] = TRAINERS[cfg.client_execution]()
        if cfg.backend == "ray":  # groups of clients on Ray workers (cfl/engine/ray_backend.py)
            from cfl.engine.ray_backend import RayClients

            self.trainer = RayClients(cfg)

    @staticmethod
    def _params_of(spec: dict[str, Any]) -> Any:
        cls = METHODS[spec["name"]].Params
        return cls(**{k: v for k, v in spec.items() if k != "name"})

    # ---- data helpers ----
    def client_indices(self, task: int) -> list[torch.Tensor]:
        if task not in self._partitions:
            p = self.cfg.partition
            labels = self.stream.tasks[task].train_y.cpu().numpy()
            parts = partition(p.name, labels, self.cfg.num_clients, self.cfg.seed, task,
                              shards_per_client=p.shards_per_client, alpha=p.alpha, beta=p.beta,
                              min_samples=p.min_samples)
            self._partitions = {task: [torch.as_tensor(ix, dtype=torch.long, device=self.device) for ix in parts]}
        return self._partitions[task]

    def allowed_classes(self, task: int, indices: torch.Tensor) -> torch.Tensor | None:
        """Classes the client's loss may use: TCE's local label set and/or class-IL's seen classes."""
        seen = self.stream.class_mask(task)
        if self.cfg.loss != "tce":
            return None if seen is None else seen.to(self.device)
        present = torch.zeros(self.stream.classes_per_head, dtype=torch.bool, device=self.device)
        present[self.stream.tasks[task].train_y[indices]] = True
        return present

    # ---- one round ----
    def run_round(self, task: int, rnd: int) -> dict[str, Any]:
        cfg, data = self.cfg, self.stream.tasks[task]
        parts = self.client_indices(task)
        cids = sample_clients(cfg.seed, task, rnd, cfg.num_clients, cfg.clients_per_round)
        jobs = [ClientJob(c, parts[c], self.allowed_classes(task, parts[c]), derive_seed(cfg.seed, task, rnd, c))
                for c in cids]
        broadcasts = [m.broadcast(st.server) for m, st in zip(self.methods, self.states, strict=True)]
        plugins = Plugins(self.methods, self.states, broadcasts)
        start = time.perf_counter()
        trained, outcomes = self.trainer(self.model, self.params, jobs, data.train_x, data.train_y, task,
                                         self.hyper, plugins)
        self.progress.train_seconds += time.perf_counter() - start
        keep = self._check_finite(trained, outcomes, task, rnd)
        kept_jobs = [j for j, ok in zip(jobs, keep.tolist(), strict=True) if ok]
        payloads = self._round_payloads(trained, kept_jobs, keep, data)
        weights = torch.tensor([float(len(j.indices)) for j in kept_jobs], device=self.device)
        forgetting = client_forgetting.measure(self, task, kept_jobs, trained, keep)  # None when off
        deltas = client_deltas(trained, self.params, keep)  # reuses ``trained``'s memory: used up from here
        delta, mask = aggregate(cfg.aggregator.name, deltas, weights, cfg.aggregator.tau)
        self.params = self._check_server_step(self._apply(delta, mask, task), task, rnd)
        for m, st, pl in zip(self.methods, self.states, payloads, strict=True):
            m.round_end(pl, st.server)
        down = len(cids) * (self.model_bytes + nbytes(broadcasts))
        up = len(kept_jobs) * self.model_bytes + nbytes(payloads)
        self.comm.down(down)
        self.comm.up(up)
        losses = [o.mean_loss for o in outcomes if o.finite]
        record = {"task": task, "round": self.progress.global_round + 1, "clients": len(kept_jobs),
                  "train_loss": float(np.mean(losses)) if losses else float("nan"),
                  "round_upload_bytes": up, "round_download_bytes": down,
                  "upload_bytes": self.comm.upload_bytes, "download_bytes": self.comm.download_bytes}
        if forgetting is not None:
            self.progress.client_forgetting.append(forgetting)
            record["client_forgetting_mean"] = forgetting["mean"]
        return record

    def _check_finite(self, trained: Params, outcomes: list[ClientOutcome], task: int, rnd: int) -> torch.Tensor:
        finite = torch.tensor([o.finite for o in outcomes], device=self.device)
        for v in trained.values():  # min and max are finite iff every entry is (NaN propagates); one pass
            low, high = torch.aminmax(v.flatten(1), dim=1)
            finite &= torch.isfinite(low) & torch.isfinite(high)
        if bool(finite.all()):
            return finite
        bad = [o.cid for o, ok in zip(outcomes, finite.tolist(), strict=True) if not ok]
        where = f"task {task} (0-based), round {rnd + 1} of the task, client(s) {bad}"
        if self.cfg.on_nonfinite == "skip_client" and bool(finite.any()):
            import warnings

            warnings.warn(f"non-finite loss or update at {where}: update dropped", stacklevel=2)
            return finite
        raise NonFiniteError(f"non-finite loss or update at {where}; lower lr (now {self.cfg.lr}) or check "
                             f"the method's parameters")

    def _check_server_step(self, new: Params, task: int, rnd: int) -> Params:
        """Refuse a global model made non-finite by the server step (every client update was finite)."""
        bad = [k for k, v in new.items() if not bool(torch.isfinite(v).all())]
        if not bad:
            return new
        server = [m.name for m in self.methods if overrides(m, "server_update")]
        raise NonFiniteError(
            f"non-finite global model after the server step at task {task} (0-based), round {rnd + 1} of the task "
            f"(parameter(s) {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}; every client update was finite): "
            f"lower server_lr (now {self.cfg.server_lr})"
            + (f" or check the server optimiser of {', '.join(server)}" if server else "")
            + f", or the aggregator ({self.cfg.aggregator.name})")

    def _round_payloads(self, trained: Params, jobs: list[ClientJob], keep: torch.Tensor,
                        data: Any) -> list[dict[int, Any]]:
        out: list[dict[int, Any]] = []
        rows = keep.nonzero().flatten().tolist()
        for m, st in zip(self.methods, self.states, strict=True):
            if not overrides(m, "round_payload"):
                out.append({})
                continue
            payload = {}
            for job, row in zip(jobs, rows, strict=True):
                client_params = {k: v[row] for k, v in trained.items()}
                cdata = ClientData(data.train_x[job.indices], data.train_y[job.indices], self.progress.task)
                result = m.round_payload(self.model, client_params, cdata, st.client(job.cid))
                if result is not None:
                    payload[job.cid] = result
            out.append(payload)
        return out

    def _apply(self, delta: Params, mask: Params | None, task: int) -> Params:
        """Apply the server step: the first method's ``server_update`` (else ``server_lr * delta``), times
        GMA's mask if any, then every method's ``transform_update`` (FOT projects the step actually taken)."""
        lr = self.cfg.server_lr
        new = next((p for m, st in zip(self.methods, self.states, strict=True)
                    if (p := m.server_update(self.params, delta, st.server, lr)) is not None), None)
        step = {k: new[k] - self.params[k] for k in self.params} if new is not None else \
            {k: lr * delta[k] for k in self.params}
        if mask is not None:
            step = {k: mask[k] * step[k] for k in self.params}
        for m, st in zip(self.methods, self.states, strict=True):
            step = m.transform_update(step, st.server, task)
        return {k: self.params[k] + step[k] for k in self.params}

    # ---- task boundaries and evaluation ----
    def evaluate(self, upto: int) -> list[float]:
        return [accuracy(self.model, self.params, t.test_x, t.test_y, j, self._eval_mask(upto))
                for j, t in enumerate(self.stream.tasks[: upto + 1])]

    def _eval_mask(self, upto: int) -> torch.Tensor | None:
        mask = self.stream.class_mask(upto)
        return None if mask is None else mask.to(self.device)

    def task_end(self, task: int) -> None:
        """Client task-end hooks (Fisher, memories, bases, GPSE) and the server's reduction."""
        start = time.perf_counter()
        parts = self.client_indices(task)
        data = self.stream.tasks[task]
        for i, (m, st) in enumerate(zip(self.methods, self.states, strict=True)):
            if not overrides(m, "task_end_client"):
                continue
            if m.task_end_participants == "sampled":
                cids = sample_clients(self.cfg.seed, task, 2**32 + i, self.cfg.num_clients,  # no real round
                                      getattr(m.p, "gpse_clients", None) or self.cfg.clients_per_round)
            else:
                cids = list(range(self.cfg.num_clients))
            broadcast = m.task_end_broadcast(st.server)
            payloads = {}
            for c in cids:
                gen = torch.Generator().manual_seed(derive_seed(self.cfg.seed, task, c, 0x7E + i))
                cdata = ClientData(data.train_x[parts[c]], data.train_y[parts[c]], task)
                result = m.task_end_client(self.model, self.params, cdata, st.client(c), broadcast, gen)
                if result is not None:
                    payloads[c] = result
            m.task_end_server(payloads, st.server, task)
            if m.task_end_needs_model:
                self.comm.down(len(cids) * self.model_bytes, line=task_end_model_line(m.name))
            self.comm.down(len(cids) * nbytes(broadcast))
            self.comm.up(nbytes(payloads))
        self.progress.task_end_seconds += time.perf_counter() - start

    def _emit(self, kind: str, *args: Any) -> None:
        for obs in self.observers:
            getattr(obs, kind)(*args)

    def eval_record(self, task: int, final: bool) -> dict[str, Any]:
        accs = self.evaluate(task)
        record = {"task": task, "round": self.progress.global_round, "final": final,
                  "acc": {str(j): a for j, a in enumerate(accs)}, "mean_acc": float(np.mean(accs)),
                  "upload_bytes": self.comm.upload_bytes, "download_bytes": self.comm.download_bytes}
        pending = client_forgetting.since_last_evaluation(self.progress.client_forgetting, self.progress.evaluations)
        if pending:
            record["client_forgetting"] = pending
        self.progress.evaluations.append(record)
        return record

    # ---- the loop ----
    def run(self) -> Progress:
        """Train from the current progress to the end (or until ``should_stop``)."""
        cfg, prog = self.cfg, self.progress
        started = time.perf_counter() - prog.wall_seconds
        while prog.task < self.stream.num_tasks:
            t = prog.task
            while prog.round_in_task < cfg.rounds_per_task:
                record = self.run_round(t, prog.round_in_task)
                prog.round_in_task += 1
                prog.global_round += 1
                last = prog.round_in_task == cfg.rounds_per_task
                if cfg.eval_every and prog.round_in_task % cfg.eval_every == 0 and not last:
                    evaluation = self.eval_record(t, final=False)
                    record["mean_acc"] = evaluation["mean_acc"]
                    self._emit("evaluation", evaluation)
                prog.wall_seconds = time.perf_counter() - started
                self._emit("round_end", record)
                if not last:
                    self.after_round()
                    if self.should_stop():
                        return prog
            evaluation = self.eval_record(t, final=True)
            prog.acc_matrix[t] = [evaluation["acc"].get(str(j)) for j in range(self.stream.num_tasks)]
            self._emit("evaluation", evaluation)
            if t < self.stream.num_tasks - 1:
                self.task_end(t)
            prog.task, prog.round_in_task = t + 1, 0
            prog.wall_seconds = time.perf_counter() - started
            self._emit("task_end", t, evaluation)
            self.after_round()
            if self.should_stop():
                return prog
        return prog
