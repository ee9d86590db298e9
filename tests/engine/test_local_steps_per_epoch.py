"""``client_start``'s ``steps`` part: each local epoch keeps its first k batches of the epoch's shuffle, on every path
(batched equals sequential), the smallest count of the run's methods applies, a broken count is refused; TARGET's
override is its code's zip of the real and the synthetic loaders."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cfl.engine.local.jobs import ClientJob, Hyper, client_schedule
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import ClientStart, Computes, Method, RunInfo
from cfl.validation import from_dict
from tests.conftest import METHOD_SETTINGS, make_stream, run_both_paths, steps_of


def test_an_epoch_keeps_its_first_batches_of_the_shuffle():
    hp = Hyper(lr=0.1, momentum=0.0, weight_decay=0.0, local_epochs=2, batch_size=3)
    job = ClientJob(cid=0, indices=torch.arange(10, 20), allowed=None, seed=7)
    every = client_schedule(job, hp)  # 4 batches an epoch (3, 3, 3, 1)
    assert [len(b) for b in every] == [3, 3, 3, 1] * 2
    capped = client_schedule(replace(job, steps_per_epoch=2), hp)
    assert len(capped) == 4
    assert all(torch.equal(a, b) for a, b in zip(capped, every[0:2] + every[4:6], strict=True))
    assert len(client_schedule(replace(job, steps_per_epoch=9), hp)) == 8  # more than it has: every batch


class Counting(Method):
    """Counts its clients' steps of the round (a step hook's carry, kept in the client state)."""

    name = "count-steps"
    cap: int | None = 1
    computes = Computes(starts=("steps", "carry"))

    def client_start(self, ctx):
        return ClientStart(steps=self.cap) if ctx.part == "steps" else ClientStart(carry={"steps": torch.zeros(())})

    def carry_step(self, step):
        return {"steps": step.carry["steps"] + 1}


class Twice(Counting):
    name = "count-steps-2"
    cap = 2


def _cfg(**kw):
    base = {"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 4, "lr": 0.1,
            "local_epochs": 2, "method": {"name": "count-steps"}, "wandb": {"mode": "disabled"}}
    return from_dict({**base, **kw})


def _steps(runner: Runner, i: int = 0) -> dict[int, float]:
    clients = runner.states[i].clients
    return {c: float(clients.get(c)["steps"]) for c in clients.ids()}


def test_both_paths_take_the_first_step_of_each_epoch_only():
    stream = make_stream("task")
    with METHODS.temporarily("count-steps", Counting):
        batched, sequential = run_both_paths(_cfg, stream)
        for runner in (batched, sequential):
            assert set(_steps(runner).values()) == {2.0}  # 1 step x 2 epochs, every client (n / batch > 1)
        Counting.cap = None
        try:
            uncapped = Runner(_cfg(), stream)
            uncapped.run()
        finally:
            Counting.cap = 1
    assert min(_steps(uncapped).values()) > 2.0
    assert any(not torch.equal(uncapped.params[k], sequential.params[k]) for k in sequential.params)


def test_the_smallest_count_of_the_methods_applies():
    with METHODS.temporarily("count-steps", Counting), METHODS.temporarily("count-steps-2", Twice):
        runner = Runner(_cfg(method={"name": "count-steps-2"}, plugins=[{"name": "count-steps"}]), make_stream("task"))
        runner.run()
    assert set(_steps(runner, 0).values()) == {2.0}


class Broken(Counting):
    name = "count-steps-0"
    cap = 0


def test_a_count_below_one_is_refused_with_the_hook_named():
    with METHODS.temporarily("count-steps-0", Broken), \
            pytest.raises(Exception, match=r"hook client_start: must give as steps None or an int >= 1"):
        Runner(_cfg(method={"name": "count-steps-0"}), make_stream("task")).run()


def test_target_cuts_an_epoch_at_the_synthetic_pools_batches():
    """The official README run: 16 real batches of 128, a pool of 2560 images in batches of 500: 6 steps."""
    cls = METHODS["target"]
    info = RunInfo(2, "class", 2, 2, 0, torch.nn.BatchNorm2d(1), batch_size=128, input_shape=(1, 8, 8))
    target = cls(cls.Hyperparams(**{**METHOD_SETTINGS["target"], "synthetic_batch": 500}), info)
    pool = {"pool": torch.zeros(2560, 1, 8, 8, dtype=torch.uint8)}
    assert steps_of(target, 16 * 128, pool) == 6
    assert steps_of(target, 3 * 128, pool) == 3  # fewer real batches than synthetic ones: all of them
    assert steps_of(target, 16 * 128, {}) is None  # the first task: no pool yet
    plain = cls(cls.Hyperparams(**{**METHOD_SETTINGS["target"], "truncated_epochs": False}), info)
    assert steps_of(plain, 16 * 128, pool) is None
