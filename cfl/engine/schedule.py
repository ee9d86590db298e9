"""Which clients train when and on what: client sampling, the per-task partitions and the label sets.

Everything here is a pure function of the config, the stream and the run seed (no state is carried
from round to round), so a resumed run samples and splits exactly as an uninterrupted one.
"""

from __future__ import annotations

import numpy as np
import torch

from cfl.config import Config
from cfl.data.partition import check_sizes, partition
from cfl.data.stream import Stream
from cfl.engine.jobs import ClientJob, derive_seed
from cfl.validation import check_joining


def sample_clients(seed: int, task: int, rnd: int, num_clients: int, k: int) -> list[int]:
    """The clients of (task, round): k of num_clients without replacement, sorted."""
    rng = np.random.default_rng(derive_seed(seed, task, rnd, 0xC11E))
    return sorted(int(c) for c in rng.choice(num_clients, size=k, replace=False))


class Schedule:
    """The clients' shares of each task (the current task's cached) and the jobs of each round."""

    def __init__(self, cfg: Config, stream: Stream, device: torch.device) -> None:
        self.cfg, self.stream, self.device = cfg, stream, device
        check_sizes(cfg.partition.name, {t: len(task.train_y) for t, task in enumerate(stream.tasks)},
                    cfg.num_clients, shards_per_client=cfg.partition.shards_per_client)  # before any round
        check_joining(cfg, stream.num_tasks)  # the stream's own task count (an Avalanche route's is known here)
        self._partitions: dict[int, list[torch.Tensor]] = {}
        if cfg.partition.name in ("dirichlet", "classes"):  # random: drawn now, so an impossible split refuses
            # before any round
            for task in reversed(range(stream.num_tasks)):
                self.client_indices(task)

    def joined(self, task: int) -> int:
        """The clients of ``task``: ids ``0 .. joined - 1`` (``clients_join_per_task``; else all of them)."""
        return self.cfg.clients_joined(task, self.stream.num_tasks)

    def client_indices(self, task: int) -> list[torch.Tensor]:
        """Each client's training rows of ``task`` (only the last task asked for is kept): the task's data split over
        the clients that have joined; a client yet to join holds no row."""
        if task not in self._partitions:
            p = self.cfg.partition
            labels = self.stream.tasks[task].train_y.cpu().numpy()
            parts = partition(p.name, labels, self.joined(task), self.cfg.seed, task,
                              shards_per_client=p.shards_per_client, alpha=p.alpha, beta=p.beta,
                              min_samples=p.min_samples, classes_per_client=p.classes_per_client, overlap=p.overlap)
            rows = [torch.as_tensor(ix, dtype=torch.long, device=self.device) for ix in parts]
            rows += [torch.zeros(0, dtype=torch.long, device=self.device)] * (self.cfg.num_clients - len(rows))
            self._partitions = {task: rows}
        return self._partitions[task]

    def allowed_classes(self, task: int, indices: torch.Tensor) -> torch.Tensor | None:
        """Classes the client's loss may use: TCE's local label set and/or class-IL's seen classes."""
        seen = self.stream.class_mask(task)
        if self.cfg.loss != "tce":
            return None if seen is None else seen.to(self.device)
        present = torch.zeros(self.stream.classes_per_head, dtype=torch.bool, device=self.device)
        present[self.stream.tasks[task].train_y[indices]] = True
        return present

    def sampled(self, task: int, rnd: int) -> list[int]:
        """The clients of (task, round), sorted."""
        return sample_clients(self.cfg.seed, task, rnd, self.joined(task), self.cfg.clients_per_round)

    def round_jobs(self, task: int, rnd: int) -> list[ClientJob]:
        """The sampled clients of (task, round), each with its rows, label set and data-order seed."""
        cfg = self.cfg
        parts = self.client_indices(task)
        cids = self.sampled(task, rnd)
        return [ClientJob(c, parts[c], self.allowed_classes(task, parts[c]), derive_seed(cfg.seed, task, rnd, c))
                for c in cids]
