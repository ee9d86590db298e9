"""``train_loss`` in ``metrics.jsonl`` (cfl/engine/rounds/runner.py): the task loss alone, the same in every engine
path.

Per client, the mean over its local steps of the step's weighted cross-entropy (its batch and any replayed
samples); averaged over the round's kept clients. A method's penalty and extra loss are left out: the stacked
path folds quadratic penalties into its fused step and never forms their value (docs/results.md)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest

from cfl.engine.local.batched import BatchedTrainer
from cfl.engine.local.sequential import train_sequential
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import ClientRound, Computes, Method, Quadratic, RoundTerms
from tests.conftest import make_stream, tiny_config

TRAINERS = {"stacked": BatchedTrainer, "vmap": BatchedTrainer, "sequential": lambda: train_sequential}


def round_losses(runner: Runner, task: int) -> dict[str, float]:
    """``train_loss`` of one round of ``task`` on each path, each from the runner's state, which is kept."""
    assert runner.engine_path.path == "stacked"  # the fused path is one of those compared
    losses = {}
    for path, trainer in TRAINERS.items():
        saved = copy.deepcopy((runner.params, runner.states, runner.comm, runner.progress, runner.hyper))
        runner.trainer, runner.hyper.path = trainer(), path
        losses[path] = runner.run_round(task, 0)["train_loss"]
        runner.params, runner.states, runner.comm, runner.progress, runner.hyper = saved
    return losses


def runner_after_task_0(method: dict) -> Runner:
    runner = Runner(tiny_config(method=method, local_epochs=2), make_stream())
    runner.run_round(0, 0)
    runner.task_end(0)
    return runner


@pytest.mark.parametrize("method", [{"name": "fedprox", "mu": 2.0}, {"name": "ewc", "lam": 500.0}])
def test_every_path_logs_the_same_train_loss_under_a_penalty(method):
    losses = round_losses(runner_after_task_0(method), 1)
    assert losses["vmap"] == pytest.approx(losses["stacked"], rel=1e-5)
    assert losses["sequential"] == pytest.approx(losses["stacked"], rel=1e-5)


@dataclass(frozen=True)
class FarAnchorHyperparams:
    pass


class FarAnchor(Method):
    """A penalty of large value and negligible gradient: weight 1e-6 at an anchor 100 from every weight, so
    1e-6/2 * 100^2 = 0.005 per weight, while the step it adds (lr * 1e-4) barely moves training."""

    name = "far-anchor"
    Hyperparams = FarAnchorHyperparams

    computes = Computes(terms=("penalty",))

    def round_terms(self, ctx: ClientRound) -> RoundTerms:
        return RoundTerms({k: Quadratic(1e-6, w + 100.0) for k, w in ctx.global_params.items()})


def test_train_loss_leaves_the_penalty_out_in_every_path():
    """With a penalty worth ~0.005 per weight, every path logs fedavg's task loss (to training's tiny drift);
    a path adding the penalty's value would be off by ``penalty``."""
    with METHODS.temporarily("far-anchor", FarAnchor):
        runner = runner_after_task_0({"name": "far-anchor"})
        penalty = 0.005 * sum(v.numel() for v in runner.params.values())
        with_penalty = round_losses(runner, 1)
    plain = round_losses(runner_after_task_0({"name": "fedavg"}), 1)
    assert penalty > 10
    for path, loss in with_penalty.items():
        assert loss == pytest.approx(plain[path], abs=1e-3), path
