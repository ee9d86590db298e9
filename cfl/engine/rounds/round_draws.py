"""Which clients train when and on what under the run's plan (cfl/schedules.py, the synchronous one included):
each round's client sample, the per-task partitions among a task's holders and the label sets.

Everything here is a pure function of the config, the stream, the plan and the run seed (no state is carried
from round to round), so a resumed run samples and splits exactly as an uninterrupted one. The synchronous plan
keeps its own draw, keyed by (task, round of the task), and its label sets (class-incremental: the classes of the
tasks the federation has reached, a late joiner's included); any other plan draws per global round among the
clients present, each masked to the tasks it has started.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from cfl.config.keys import Config
from cfl.config.schema import ConfigError
from cfl.data.partition import check_sizes, partition
from cfl.data.stream import Stream
from cfl.engine.local.jobs import ClientJob, derive_seed
from cfl.schedule_checks import check_plan
from cfl.schedules import Plan
from cfl.validation import check_joining

#: the derived seed stream of a scheduled round's client sample (the synchronous one keys (task, round))
_SAMPLE_SALT = 0x5C11E


def sample_clients(seed: int, task: int, rnd: int, num_clients: int, k: int) -> list[int]:
    """The clients of (task, round): k of num_clients without replacement, sorted."""
    rng = np.random.default_rng(derive_seed(seed, task, rnd, 0xC11E))
    return sorted(int(c) for c in rng.choice(num_clients, size=k, replace=False))


class Schedule:
    """The clients' shares of each task (split among the task's holders, in id order) and each round's jobs,
    grouped by task."""

    def __init__(self, cfg: Config, stream: Stream, plan: Plan, device: torch.device) -> None:
        self.cfg, self.stream, self.plan, self.device = cfg, stream, plan, device
        self.intervals = plan.intervals()
        self._partitions: dict[int, list[torch.Tensor]] = {}  # task -> each client's rows (empty: not a holder)
        if plan.synchronous:  # before any round
            check_sizes(cfg.partition.name, {t: len(task.train_y) for t, task in enumerate(stream.tasks)},
                        cfg.num_clients, shards_per_client=cfg.partition.shards_per_client)
            check_joining(cfg, stream.num_tasks)  # the stream's own task count (an Avalanche route's is known here)
            drawn_now = cfg.partition.name in ("dirichlet", "classes")  # random: an impossible split refuses now
        else:
            for note in check_plan(plan, cfg.clients_per_round):
                print(f"cfl: {note}", file=sys.stderr)
            drawn_now = True  # a holder with no sample refuses now
        if drawn_now:
            for task in range(stream.num_tasks):
                self.client_indices(task)

    def joined(self, task: int) -> int:
        """The clients of ``task`` under the synchronous plan: ids ``0 .. joined - 1`` (``clients_join_per_task``;
        else all of them)."""
        return self.cfg.clients_joined(task, self.stream.num_tasks)

    def client_indices(self, task: int) -> list[torch.Tensor]:
        """Each client's training rows of ``task``: the task's data split over its holders; a client that never
        holds it has no row."""
        if task not in self._partitions:
            p, holders = self.cfg.partition, self.plan.holders(task)
            labels = self.stream.tasks[task].train_y.cpu().numpy()
            parts = partition(p.name, labels, len(holders), self.cfg.seed, task,
                              shards_per_client=p.shards_per_client, alpha=p.alpha, beta=p.beta,
                              min_samples=p.min_samples, classes_per_client=p.classes_per_client, overlap=p.overlap)
            rows = [torch.zeros(0, dtype=torch.long, device=self.device)] * len(self.plan.timelines)
            for c, ix in zip(holders, parts, strict=True):
                rows[c] = torch.as_tensor(ix, dtype=torch.long, device=self.device)
            empty = [c for c in holders if len(rows[c]) == 0]
            if empty and not self.plan.synchronous:
                raise ConfigError(f"under schedule '{self.plan.name}' client(s) {empty[:5]} hold no sample of task "
                                  f"{task} ({len(labels)} samples over {len(holders)} clients): they would train on "
                                  "nothing; lower num_clients or use another partition")
            self._partitions[task] = rows
        return self._partitions[task]

    def global_round(self, task: int, rnd: int) -> int:
        """The global round (0-based) of the round a loop names ``(task, rnd)``: under the synchronous plan ``rnd``
        of ``task``, under any other ``rnd`` itself."""
        return task * self.cfg.rounds_per_task + rnd if self.plan.synchronous else rnd

    def sampled(self, rnd: int) -> list[int]:
        """The clients of global round ``rnd``, sorted: the synchronous plan's ``clients_per_round`` of the task's
        joined clients; any other's ``clients_per_round`` of those present (all, if fewer)."""
        if self.plan.synchronous:
            task, r = divmod(rnd, self.cfg.rounds_per_task)
            return sample_clients(self.cfg.seed, task, r, self.joined(task), self.cfg.clients_per_round)
        present = [c for c, _, start, end in self.intervals if start <= rnd < end]
        k = min(self.cfg.clients_per_round, len(present))
        rng = np.random.default_rng(derive_seed(self.cfg.seed, rnd, _SAMPLE_SALT))
        return sorted(int(present[i]) for i in rng.choice(len(present), size=k, replace=False))

    def groups(self, rnd: int) -> list[tuple[int, list[ClientJob]]]:
        """The sampled clients of global round ``rnd`` as jobs, grouped by task (ascending), each with its rows,
        label set and data-order seed (from its task and its rounds on it)."""
        by_task: dict[int, list[ClientJob]] = {}
        for c in self.sampled(rnd):
            task = self.plan.seen(c, rnd)[-1]
            rows = self.client_indices(task)[c]
            seed = derive_seed(self.cfg.seed, task, self.plan.rounds_in_task(c, rnd), c)
            by_task.setdefault(task, []).append(ClientJob(c, rows, self.allowed(c, rnd, task, rows), seed))
        return sorted(by_task.items())

    def newest_task(self, rnd: int) -> int:
        """The highest task a client sampled in global round ``rnd`` trains on (the round's task for the server's
        hooks; the synchronous plan's task of the round)."""
        return max(self.plan.seen(c, rnd)[-1] for c in self.sampled(rnd))

    def round_jobs(self, task: int, rnd: int) -> list[ClientJob]:
        """The jobs of the round a loop names ``(task, rnd)`` (:meth:`global_round`) that train on ``task``."""
        return dict(self.groups(self.global_round(task, rnd))).get(task, [])

    def allowed(self, client: int, rnd: int, task: int, rows: torch.Tensor) -> torch.Tensor | None:
        """Classes the client's loss may use: TCE's local label set, else (class-incremental) those of the tasks
        reached (:mod:`module docstring <cfl.engine.rounds.round_draws>`)."""
        if self.cfg.loss == "tce":
            present = torch.zeros(self.stream.classes_per_head, dtype=torch.bool, device=self.device)
            present[self.stream.tasks[task].train_y[rows]] = True
            return present
        return self.class_mask(list(range(task + 1)) if self.plan.synchronous else self.plan.seen(client, rnd))

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
        return sorted({task for _, task, start, _ in self.intervals if start <= rnd})
