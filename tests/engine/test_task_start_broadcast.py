"""``broadcast["task_start"]``: the keys go to a client at its first sampled round of each task, are
counted once per client and task, and the client's hooks see them in every round of the task; a key changed
during a task, an unknown event, or a key sent both each round and at task starts are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import Method, Sends
from cfl.methods.hook_guard import HookError
from cfl.metrics.results import method_stats
from cfl.validation import from_dict
from tests.conftest import make_stream

POOL = torch.zeros(10)  # 40 bytes of float32


class Pool(Method):
    """Makes a pool at each task end; records, per round, the broadcast its clients' hooks see."""

    name = "pool-probe"
    sends = Sends(server_events=("before_task_end",), broadcast={"task_start": ("pool",)}, client_events=("round",))

    def __init__(self, hparams, run_info) -> None:
        super().__init__(hparams, run_info)
        self.seen: list[tuple[int, bool]] = []  # (task, pool in the broadcast) per kept client and round


    def server_event(self, ctx):
        model, classes, server, task = ctx.model, ctx.classes, ctx.server, ctx.task  # noqa: F841
        server["pool"] = POOL + task

    def client_end(self, ctx):
        data, server = ctx.data, ctx.server
        self.seen.append((int(data.task), "pool" in server))


class PoolOnly(Pool):
    name = "pool-only"
    sends = Sends(client_events=("round",))


def _run(name: str, clients: int, per_round: int, rounds: int = 3) -> Runner:
    with METHODS.temporarily("pool-probe", Pool), METHODS.temporarily("pool-only", PoolOnly):
        cfg = from_dict({"num_clients": clients, "clients_per_round": per_round, "rounds_per_task": rounds,
                         "batch_size": 8, "lr": 0.1, "method": {"name": name}, "wandb": {"mode": "disabled"}})
        runner = Runner(cfg, make_stream("task", num_tasks=2, n_train=24, n_test=6))
        runner.run()
    return runner


def test_every_client_downloads_the_pool_once_per_task():
    """3 clients, all sampled in each of 3 rounds of task 1: 3 x 40 bytes (not 9 x 40); task 0 has no pool yet."""
    runner, plain = _run("pool-probe", 3, 3), _run("pool-only", 3, 3)
    assert runner.comm.lines["task_start.pool-probe"] == 3 * 40
    assert runner.comm.download_bytes - plain.comm.download_bytes == 3 * 40
    assert method_stats(runner.comm, runner.methods[0], runner.states[0])["task_start_download_bytes"] == 120
    # the hooks see it in every round of task 1 (the client keeps it), in no round of task 0
    assert runner.methods[0].seen == [(0, False)] * 9 + [(1, True)] * 9


def test_a_client_sampled_again_in_the_task_is_not_counted_again():
    """4 clients, 2 a round, 3 rounds: 6 draws over 4 clients repeat one at least; each counts once."""
    runner = _run("pool-probe", 4, 2)
    sampled = [runner.schedule.sampled(runner.schedule.global_round(1, r)) for r in range(3)]
    distinct = len(set().union(*sampled))
    assert distinct < 6
    assert runner.comm.lines["task_start.pool-probe"] == distinct * 40


class Changing(Pool):
    """Changes its task_start key in a round: what clients sampled earlier hold is no longer the server's."""

    name = "pool-changing"

    sends = dataclasses.replace(Pool.sends, server_events=("round", "before_task_end"))

    def server_event(self, ctx):
        if ctx.event == "before_task_end":
            return super().server_event(ctx)
        if ctx.task == 1:
            ctx.server["pool"] = ctx.server["pool"] + 1
        return None


def test_a_key_changed_during_its_task_is_refused():
    with METHODS.temporarily("pool-changing", Changing):
        cfg = from_dict({"num_clients": 2, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8,
                         "lr": 0.1, "method": {"name": "pool-changing"}, "wandb": {"mode": "disabled"}})
        runner = Runner(cfg, make_stream("task", num_tasks=2, n_train=24, n_test=6))
        with pytest.raises(HookError, match=r"pool listed under broadcast\['task_start'\] changed in a round"):
            runner.run()
    assert runner.progress.task == 1 and runner.progress.round_in_task == 1


def test_an_unknown_broadcast_event_or_a_key_sent_both_ways_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"broadcast names the event\(s\) \['task_begin'\]; they are "
                                        r"\['round', 'task_start', 'task_end'\]"):
        type("Bad", (Method,), {"name": "bad", "sends": Sends(broadcast={"task_begin": ("pool",)})})
    with pytest.raises(TypeError, match=r"lists \['pool'\] under both 'round' and 'task_start'"):
        type("Bad", (Method,), {"name": "bad", "sends": Sends(broadcast={"round": ("pool",), "task_start": ("pool",)})})
