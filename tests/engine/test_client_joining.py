"""Clients joining at each task (``clients_join_per_task``, GLFC's protocol): rounds sample, partitions split and
task ends visit only the clients that have joined; 0 keeps every client from the start."""

from __future__ import annotations

import pytest
import torch

from cfl.config.schema import ConfigError
from cfl.engine.rounds.round_draws import Schedule, sample_clients
from cfl.engine.rounds.runner import Runner
from cfl.schedules import build_plan
from tests.conftest import make_stream, tiny_config


def test_clients_joined_per_task():
    """9 clients, 3 tasks, 2 joining per task: 5, 7, 9."""
    cfg = tiny_config(num_clients=9, clients_join_per_task=2)
    assert [cfg.clients_joined(t, 3) for t in range(3)] == [5, 7, 9]
    assert [tiny_config(num_clients=9).clients_joined(t, 3) for t in range(3)] == [9, 9, 9]


def test_rounds_sample_only_joined_clients_and_partitions_split_among_them():
    stream = make_stream("class", num_tasks=3, n_train=90)
    cfg = tiny_config(num_clients=9, clients_per_round=4, clients_join_per_task=2, rounds_per_task=30)
    schedule = Schedule(cfg, stream, build_plan(cfg, 3), torch.device("cpu"))
    for task, joined in enumerate([5, 7, 9]):
        seen = {job.cid for rnd in range(30) for job in schedule.round_jobs(task, rnd)}
        assert seen == set(range(joined)), (task, seen)  # 30 rounds of 4 reach every joined client, no other
        parts = schedule.client_indices(task)
        assert len(parts) == 9 and all(len(p) == 0 for p in parts[joined:])
        assert sorted(torch.cat(parts[:joined]).tolist()) == list(range(90))  # iid: the task's data, once


def test_without_joining_the_draw_is_the_plain_one():
    stream = make_stream("class", num_tasks=3, n_train=90)
    cfg = tiny_config(num_clients=9, clients_per_round=4)
    schedule = Schedule(cfg, stream, build_plan(cfg, 3), torch.device("cpu"))
    for task in range(3):
        assert [j.cid for j in schedule.round_jobs(task, 1)] == sample_clients(0, task, 1, 9, 4)


def test_task_end_visits_only_joined_clients():
    """GLFC's memory: only the clients of the first task hold one after it (task_end_clients None: all joined)."""
    stream = make_stream("class", num_tasks=2, n_train=60, dim=16)  # 16: a 4x4 image for GLFC's LeNet
    cfg = tiny_config(num_clients=6, clients_per_round=2, rounds_per_task=1, clients_join_per_task=3,
                      method={"name": "glfc", "memory_size": 4, "reconstruction_steps": 1,
                              "reconstructions_kept": 1, "perturb_steps": 1, "reconstruction_iterations": 2},
                      model={"name": "mlp"})
    runner = Runner(cfg, stream)
    runner.run_round(0, 0)
    runner.task_end(0)
    assert sorted(runner.states[0].clients.ids()) == [0, 1, 2]


def test_a_task_end_draw_larger_than_the_first_tasks_clients_is_refused():
    stream = make_stream("task", num_tasks=3, n_train=60)
    cfg = tiny_config(num_clients=8, clients_per_round=2, clients_join_per_task=3,
                      method={"name": "fot", "gpse_clients": 4})
    with pytest.raises(ConfigError, match="draws 4 clients at each task end, but the first task has 2"):
        Runner(cfg, stream)
