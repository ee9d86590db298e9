"""``backend: ray``: a round's sampled clients trained in groups on Ray workers; the server stays in the driver.

The clients (sorted by id, as the runner hands them over) are cut into ``ray_workers`` contiguous groups.
Each group is one Ray task running the ordinary trainer (``client_execution``, batched by default, so a
worker keeps the batched engine's speed) on only the rows of the task's data its clients hold, with the
sampled clients' method states (read only: local training writes no state); the stacked parameters and
outcomes come back and are concatenated in client order. Data order and replay draws are seeded per
client (``ClientJob.seed``), so they do not depend on where a client trains. Draws from torch's global
generator (dropout masks, augmentation) are made from a generator seeded by :func:`group_seed`, a pure
function of the run seed, task, round and the group's clients: results do not depend on which worker or
node ran a group, but for models with dropout or streams with augmentation they differ from the local
backend's (which draws from the driver's generator). Without dropout or augmentation a run matches the
local backend (``tests/app/test_ray_backend.py``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import nn

from cfl.config.keys import Config
from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, ClientOutcome, Hyper, RoundMethods, derive_seed
from cfl.engine.local.path import trainer_kind
from cfl.engine.local.sequential import train_sequential
from cfl.methods.base import Method
from cfl.plugin_files import ship_to_ray
from cfl.ray_support import init_ray, require_ray
from cfl.records.client_states import ClientStates, MethodState
from cfl.tensors import Params, State

GROUP_TRAINERS = {"batched": train_batched, "sequential": train_sequential}


def split_groups(jobs: list[ClientJob], groups: int) -> list[list[ClientJob]]:
    """``jobs`` in at most ``groups`` contiguous, near-equal, non-empty groups (order kept)."""
    return [[jobs[i] for i in part] for part in np.array_split(np.arange(len(jobs)), min(groups, len(jobs)))]


def group_seed(jobs: list[ClientJob]) -> int:
    """Seed of a group's global-generator draws: depends only on its clients' (seed, task, round, client) seeds."""
    return derive_seed(*(job.seed for job in jobs), 0xD20)


def local_rows(jobs: list[ClientJob]) -> tuple[torch.Tensor, list[ClientJob]]:
    """The data rows a group needs (sorted) and its jobs with indices into those rows."""
    rows = torch.unique(torch.cat([job.indices for job in jobs]))
    return rows, [replace(job, indices=torch.searchsorted(rows, job.indices)) for job in jobs]


def train_group(trainer: str, model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                y: torch.Tensor, task: int, hp: Hyper, methods: list[Method], client_states: list[dict[int, State]],
                broadcasts: list[State], threads: int) -> tuple[Params, list[ClientOutcome]]:
    """One group's local training (on a Ray worker, or in-process): parameters stacked over the group's
    clients and their outcomes."""
    if threads:
        torch.set_num_threads(threads)
    states = [MethodState(clients=ClientStates(cs)) for cs in client_states]
    round_methods = RoundMethods(methods, states, broadcasts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(group_seed(jobs))
        params, outcomes = GROUP_TRAINERS[trainer](model, global_params, jobs, x, y, task, hp, round_methods)
    return params, outcomes


class RayClients:
    """A trainer with the contract of :func:`cfl.engine.local.batched.train_batched` that fans out to Ray."""

    def __init__(self, cfg: Config, path: str) -> None:
        self.ray = require_ray("'backend: ray'")
        init_ray(self.ray, cfg.ray_address, cfg.ray_workers)
        ship_to_ray(self.ray)  # --plugin methods travel to the workers by value
        self.groups, self.threads = cfg.ray_workers, cfg.threads or 1
        self.trainer = trainer_kind(cfg.client_execution, path)
        self.remote = self.ray.remote(train_group).options(num_cpus=1)

    def __call__(self, model: nn.Module, global_params: Params, jobs: list[ClientJob], x: torch.Tensor,
                 y: torch.Tensor, task: int, hp: Hyper,
                 round_methods: RoundMethods) -> tuple[Params, list[ClientOutcome]]:
        ray = self.ray
        shared = [ray.put(v) for v in (model, global_params, hp, round_methods.methods, round_methods.broadcasts)]
        model_ref, params_ref, hp_ref, methods_ref, broadcasts_ref = shared
        futures = []
        for group in split_groups(jobs, self.groups):
            rows, local_jobs = local_rows(group)
            states = [{job.cid: st.clients.get(job.cid) for job in group} for st in round_methods.states]
            futures.append(self.remote.remote(self.trainer, model_ref, params_ref, local_jobs, x[rows], y[rows], task,
                                              hp_ref, methods_ref, states, broadcasts_ref, self.threads))
        results = ray.get(futures)
        params = {k: torch.cat([r[0][k] for r in results]) for k in global_params}
        return params, [o for r in results for o in r[1]]
