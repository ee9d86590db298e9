"""The round loop under a schedule other than the synchronous one (cfl/schedules.py): clients on their own tasks.

Each global round samples among the clients present at that round (a pure function of the seed and the round),
trains each task's sampled clients on its data (one trainer call per task) and aggregates them all into the one
global model. Task boundaries are per client and per task:

* a client's task end is its own event: after the round at which it switches, its ``client_end("task_end")``
  runs on its rows of the task it leaves, with the then-current global model (and the method's ``"task_end"``
  broadcast); a method that draws its own task-end clients (``task_end_clients``) draws them among the task's
  finishers (:func:`task_end_draws`). The uploads go to ``server_end("task_end", uploads, task)`` after that
  round (``Method.server_task_end: switch``), or are held in the method's server state (:data:`HELD`) until the
  server's task end (``last_holder``);
* the server's task end of a task comes when its last holder has switched away from it (none for a task some
  client still holds at the run's end): ``before_task_end`` on the global model of that moment (its classes
  those of every task all of whose holders have left it), then a ``last_holder`` method's ``server_end``;
* ``"task_start"`` keys go to a client at its own task starts and again after a task end changed them
  (:class:`cfl.engine.task_start.ScheduledTaskStarts`).

The server-side hooks of a round (``server_end("round")``, ``after_server_step``, ``transform_update``) get as
``task`` the highest task id that a client sampled in the round trains on. An evaluation follows every round at
which some client switched, every ``eval_every`` rounds and the last round: the global model on every task any
client has started (class-incremental: masked to the classes of those tasks).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch

from cfl.config import Config
from cfl.data.partition import partition
from cfl.data.stream import Stream
from cfl.engine.jobs import ClientJob, derive_seed
from cfl.engine.schedule import sample_clients
from cfl.engine.server_state import broadcast_of, plain_server
from cfl.engine.task_end import before_task_end
from cfl.engine.traffic import record_task_end
from cfl.methods.base import overrides, takes_part_at_task_end
from cfl.methods.hook_guard import guarded
from cfl.methods.hook_types import ClientData
from cfl.metrics.evaluate import accuracy
from cfl.metrics.schedule import scheduled_matrix
from cfl.records.snapshot import Progress
from cfl.schedules import Plan, check_plan
from cfl.schema import ConfigError

#: the run's cfl.engine.runner.Runner, which calls into this module (so not imported here: no import circle)
Runner = Any

#: the derived seed stream of a scheduled round's client sample (the synchronous one keys (task, round))
_SAMPLE_SALT = 0x5C11E
#: the server-state key under which the engine holds a ``server_task_end: last_holder`` method's task-end uploads
#: (task -> client -> upload) from the clients' own task ends until the task's server-side end (checkpointed)
HELD = "held_task_end_uploads"


class ScheduledRounds:
    """The clients' shares of each task (split among the task's holders) and each round's jobs, grouped by task."""

    def __init__(self, cfg: Config, stream: Stream, plan: Plan, device: torch.device) -> None:
        self.cfg, self.stream, self.plan, self.device = cfg, stream, plan, device
        self.grid = plan.grid
        for note in check_plan(plan, cfg.clients_per_round):
            print(f"cfl: {note}", file=sys.stderr)
        self.rows: dict[int, dict[int, torch.Tensor]] = {}  # task -> client -> its rows
        p = cfg.partition
        for task in range(stream.num_tasks):
            holders = plan.holders(task)
            labels = stream.tasks[task].train_y.cpu().numpy()
            parts = partition(p.name, labels, len(holders), cfg.seed, task, shards_per_client=p.shards_per_client,
                              alpha=p.alpha, beta=p.beta, min_samples=p.min_samples,
                              classes_per_client=p.classes_per_client, overlap=p.overlap)
            self.rows[task] = {c: torch.as_tensor(ix, dtype=torch.long, device=device)
                               for c, ix in zip(holders, parts, strict=True)}
            empty = [c for c, r in self.rows[task].items() if len(r) == 0]
            if empty:  # before any round
                raise ConfigError(f"under schedule '{plan.name}' client(s) {empty[:5]} hold no sample of task {task} "
                                  f"({len(labels)} samples over {len(holders)} clients): they would train on "
                                  "nothing; lower num_clients or use another partition")

    def sampled(self, rnd: int) -> list[int]:
        """The clients of global round ``rnd``: ``clients_per_round`` of those present (all, if fewer), sorted."""
        present = np.flatnonzero(self.grid[:, rnd] >= 0)
        k = min(self.cfg.clients_per_round, len(present))
        rng = np.random.default_rng(derive_seed(self.cfg.seed, rnd, _SAMPLE_SALT))
        return sorted(int(present[i]) for i in rng.choice(len(present), size=k, replace=False))

    def groups(self, rnd: int) -> list[tuple[int, list[ClientJob]]]:
        """The sampled clients of round ``rnd`` as jobs, grouped by task (ascending), each with its rows, label
        set and data-order seed (from its task and its rounds on it)."""
        by_task: dict[int, list[ClientJob]] = {}
        for c in self.sampled(rnd):
            task = int(self.grid[c, rnd])
            rows = self.rows[task][c]
            seed = derive_seed(self.cfg.seed, task, self.plan.rounds_in_task(c, rnd), c)
            by_task.setdefault(task, []).append(ClientJob(c, rows, self.allowed(c, rnd, task, rows), seed))
        return sorted(by_task.items())

    def allowed(self, client: int, rnd: int, task: int, rows: torch.Tensor) -> torch.Tensor | None:
        """Classes the client's loss may use: TCE's local label set, else (class-incremental) those of the tasks it
        has started."""
        if self.cfg.loss == "tce":
            present = torch.zeros(self.stream.classes_per_head, dtype=torch.bool, device=self.device)
            present[self.stream.tasks[task].train_y[rows]] = True
            return present
        return self.class_mask(self.plan.seen(client, rnd))

    def class_mask(self, tasks: list[int]) -> torch.Tensor | None:
        """Class-incremental: the head's classes of ``tasks``; None otherwise."""
        if self.stream.scenario != "class":
            return None
        mask = torch.zeros(self.stream.classes_per_head, dtype=torch.bool, device=self.device)
        for t in tasks:
            mask[self.stream.tasks[t].classes] = True
        return mask

    def started(self, rnd: int) -> list[int]:
        """The tasks some client has trained on by the end of global round ``rnd``."""
        return sorted({int(t) for t in np.unique(self.grid[:, : rnd + 1]) if t >= 0})


def task_end_draws(runner: Runner) -> dict[tuple[int, int], set[int]]:
    """(method index, task) -> the clients a method that draws its own task-end clients (``task_end_clients``)
    takes among those that finish the task (known from the plan: a pure function of the seed); fewer finishers
    than its draw: all of them, said on stderr."""
    plan, out = runner.plan, {}
    for i, m in enumerate(runner.methods):
        if m.task_end_clients is None or not takes_part_at_task_end(m):
            continue
        for task in range(plan.num_tasks):
            finishers = plan.finishers(task)
            if not finishers:
                continue
            k = min(m.task_end_clients, len(finishers))
            if k < m.task_end_clients:
                print(f"cfl: method {m.name} draws {m.task_end_clients} task-end clients, but under schedule "
                      f"'{plan.name}' only {len(finishers)} finish task {task}: all of them take part",
                      file=sys.stderr)
            picks = sample_clients(runner.cfg.seed, task, 2**32 + i, len(finishers), k)
            out[(i, task)] = {finishers[j] for j in picks}
    return out


def evaluate(runner: Runner, rnd: int, switched: list[tuple[int, int]], final: bool) -> dict[str, Any]:
    """The global model on every task some client has started; the record kept in ``progress.evaluations``."""
    tasks = runner.scheduled.started(rnd)
    mask = runner.scheduled.class_mask(tasks)
    per_model = [[accuracy(runner.model, params, runner.stream.tasks[j].test_x, runner.stream.tasks[j].test_y, j,
                           mask) for j in tasks] for params in runner._evaluated()]
    accs = per_model[0] if len(per_model) == 1 else [float(np.mean(c)) for c in zip(*per_model, strict=True)]
    prog = runner.progress
    record = {"task": max(tasks), "round": prog.global_round, "final": final,
              "acc": {str(j): a for j, a in zip(tasks, accs, strict=True)}, "mean_acc": float(np.mean(accs)),
              "switched": [[c, t] for c, t in switched],
              "upload_bytes": runner.comm.upload_bytes, "download_bytes": runner.comm.download_bytes}
    prog.evaluations.append(record)
    return record


def client_task_ends(runner: Runner, switched: list[tuple[int, int]]) -> None:
    """Each method's ``client_end("task_end")`` on the clients switching after this round (each on its rows of the
    task it leaves, at the current global model; a method's own draw: its drawn clients only), then, per task
    left, its ``server_end("task_end")`` with their uploads, or (``server_task_end: last_holder``) the uploads held
    in its server state until the task's last holder has left it (:func:`server_task_ends`)."""

    rows = runner.scheduled.rows
    for i, (m, st) in enumerate(zip(runner.methods, runner.states, strict=True)):
        for task in sorted({t for _, t in switched}):
            uploads: dict[int, Any] = {}
            drawn = runner.task_end_draws.get((i, task))
            cids = [c for c, t in switched if t == task and (drawn is None or c in drawn)]
            if takes_part_at_task_end(m) and cids:
                broadcast = broadcast_of(m, "task_end", st.server)
                data = runner.stream.tasks[task]
                for c in cids:
                    gen = torch.Generator().manual_seed(derive_seed(runner.cfg.seed, task, c, 0x7E + i))
                    cdata = ClientData(data.train_x, data.train_y, task, rows=rows[task][c])
                    runner._client_end(i, "task_end", runner.params, cdata, c, broadcast, gen, uploads)
                record_task_end(runner.comm, m, len(cids), runner.model_download_bytes, broadcast, uploads)
            if m.server_task_end == "last_holder":
                if uploads:  # a task some client holds to the run's end never uses them
                    st.server.setdefault(HELD, {}).setdefault(task, {}).update(uploads)
            elif overrides(m, "server_end"):
                with guarded(m, "server_end"):
                    m.server_end("task_end", uploads, st.server, task)
                plain_server(m, "server_end", st.server)


def server_task_ends(runner: Runner, tasks: list[int], rnd: int) -> None:
    """For each task whose last holder has just left it (after global round ``rnd``): every method's
    ``before_task_end`` on the global model (``classes``: those of every task all of whose holders have left it
    by now), then a ``last_holder`` method's ``server_end("task_end")`` with the uploads held for the task."""

    left = [t for t, r in runner.plan.last_left().items() if r <= rnd]
    classes = torch.tensor(sorted({c for t in left for c in runner.stream.tasks[t].classes}), dtype=torch.long)
    for task in tasks:
        for m, st in zip(runner.methods, runner.states, strict=True):
            if overrides(m, "before_task_end"):
                before_task_end(runner, m, st.server, task, classes)
            if m.server_task_end == "last_holder":
                held = st.server.get(HELD, {})
                uploads = held.pop(task, {})
                if not held:
                    st.server.pop(HELD, None)
                if overrides(m, "server_end"):
                    with guarded(m, "server_end"):
                        m.server_end("task_end", uploads, st.server, task)
                    plain_server(m, "server_end", st.server)


def run_scheduled(runner: Runner) -> Progress:
    """Train from the current progress to the schedule's last round (or until ``runner.should_stop``)."""
    cfg, prog, plan = runner.cfg, runner.progress, runner.plan
    started = time.perf_counter() - prog.wall_seconds
    if runner.measures_forward_transfer and prog.global_round == 0 and not prog.acc_init:  # GEM's b_i
        prog.acc_init = [runner.accuracy_of(j) for j in range(runner.stream.num_tasks)]
    switches, server_ends = plan.switches(), {}
    for task, rnd in plan.last_left().items():
        server_ends.setdefault(rnd, []).append(task)
    while prog.global_round < plan.rounds:
        rnd = prog.global_round
        groups = runner.scheduled.groups(rnd)
        task = max(t for t, _ in groups)
        record = runner.run_round(task, rnd, groups)
        prog.global_round += 1
        last = prog.global_round == plan.rounds
        switched = switches.get(rnd, [])
        if switched:
            start = time.perf_counter()
            runner.task_starts.before_task_ends([st.server for st in runner.states])
            client_task_ends(runner, switched)
            server_task_ends(runner, server_ends.get(rnd, []), rnd)
            runner.task_starts.after_task_ends(rnd, [st.server for st in runner.states])
            prog.task_end_seconds += time.perf_counter() - start
            prog.task = sum(len(tasks) for r, tasks in server_ends.items() if r <= rnd)  # tasks all left
        if switched or last or (cfg.eval_every and prog.global_round % cfg.eval_every == 0):
            evaluation = evaluate(runner, rnd, switched, final=bool(switched) or last)
            record["mean_acc"] = evaluation["mean_acc"]
            runner._emit("evaluation", evaluation)
        prog.wall_seconds = time.perf_counter() - started
        runner._emit("round_end", record)
        if last:
            prog.task = runner.stream.num_tasks
            prog.acc_matrix = scheduled_matrix(prog.evaluations, plan)
            if runner.stream.scenario == "class":
                prog.class_acc = runner.class_accuracy(runner.stream.num_tasks - 1)
            runner._emit("task_end", task, prog.evaluations[-1])
        runner.after_round()
        if not last and runner.should_stop():
            return prog
    return prog
