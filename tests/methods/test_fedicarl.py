"""FediCaRL's hooks with hand-computed answers: the herding order and the per-class memory over two task ends, iCaRL's
sigmoid/BCE loss with the old model's targets, the replay draw, and the refusal of task- and domain-incremental
streams."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cfl.config.schema import ConfigError
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.fedicarl import FediCaRL, FediCaRLHyperparams
from cfl.methods.training_hooks import ClientEndContext, LossContext, SamplesContext


class Features(nn.Module):
    """A linear head on the inputs themselves: the features herding reads are the inputs."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(2, classes)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def make(memory_size: int = 3, classes: int = 2, scenario: str = "class", **hp) -> tuple[FediCaRL, dict]:
    model = Features(classes)
    info = RunInfo(num_tasks=classes, scenario=scenario, num_clients=1, clients_per_round=1, seed=0, model=model,
                   batch_size=2, input_shape=(2,), num_classes=classes,
                   task_classes=tuple((c,) for c in range(classes)))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return FediCaRL(FediCaRLHyperparams(memory_size=memory_size, **hp), info), params


def end_task(method: FediCaRL, params: dict, state: dict, x: list[list[float]], label: int, task: int) -> None:
    data = ClientData(torch.tensor(x, dtype=torch.float32), torch.full((len(x),), label), task)
    method.client_end(ClientEndContext("task_end", method.run_info.model, params, data, state, {},
                                       torch.Generator().manual_seed(0)))


def rows(state: dict) -> list[list[float]]:
    return [[round(v, 4) for v in r] for r in state["x"][state["valid"]].tolist()]


def test_herding_picks_a_tiny_class_in_the_order_computed_by_hand_and_shares_the_budget_per_class():
    method, params = make(memory_size=3)
    state: dict = {}
    # unit features, mean mu = (0.6, 0.6). Step 1: ||mu - f||^2 = .52, .52, .04, .04: index 2 (ties: the lowest).
    # Step 2: ||mu - (f2 + f)/2||^2 = .08 (f0), .18 (f1), .02 (f3): index 3. Step 3: .0578 (f0), .0578 (f1): index 0
    end_task(method, params, state, [[1, 0], [0, 1], [0.6, 0.8], [0.8, 0.6]], label=0, task=0)
    assert rows(state) == [[0.6, 0.8], [0.8, 0.6], [1.0, 0.0]]
    assert state["y"].tolist() == [0, 0, 0] and state["old_classes"].tolist() == [True, False]
    # a second class: 3 // 2 = 1 exemplar per class; class 0 keeps its first. Class 1's mean (0.6, 0.5333):
    # ||mu - f||^2 = .4444 (1, 0), .0444 (0.8, 0.6), .5778 (0, 1): the middle one
    end_task(method, params, state, [[1, 0], [0.8, 0.6], [0, 1]], label=1, task=1)
    assert rows(state) == [[0.6, 0.8], [0.8, 0.6]]
    assert state["y"][:2].tolist() == [0, 1] and state["task"][:2].tolist() == [0, 1]
    assert state["valid"].tolist() == [True, True, False]
    assert state["old_classes"].tolist() == [True, True]


def test_the_task_end_keeps_the_final_global_model_as_the_teacher():
    method, params = make()
    state: dict = {}
    end_task(method, params, state, [[1, 0]], label=0, task=0)
    for k, v in params.items():
        assert torch.equal(state["teacher"][k], v) and state["teacher"][k] is not v


def _loss(method: FediCaRL, logits: list[float], y: int, allowed: list[bool] | None, state: dict) -> float:
    z = torch.tensor([logits], dtype=torch.float32)
    mask = None if allowed is None else torch.tensor(allowed)
    got = method.loss(LossContext("task", {}, torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), torch.ones(1), {},
                                  state, logits=z, y=torch.tensor([y]), allowed=mask)).task
    return float(got[0])


def zero_teacher(classes: int = 3) -> dict:
    """A teacher with zero logits (sigmoid 1/2) and class 0 old."""
    return {"teacher": {"head.weight": torch.zeros(classes, 2), "head.bias": torch.zeros(classes)},
            "old_classes": torch.tensor([True] + [False] * (classes - 1))}


SP2, SPM1, SP1 = math.log(1 + math.e ** 2), math.log(1 + math.e ** -1), math.log(1 + math.e)  # softplus(2, -1, 1)


def test_icarls_loss_by_hand_old_columns_take_the_old_models_sigmoid():
    method, _ = make(classes=3)
    # BCE(z, t) = softplus(z) - t z. Logits (2, -1, 1), label 2, class 0 old with target sigmoid(0) = 1/2:
    # (softplus(2) - 1, softplus(-1), softplus(1) - 1) averaged over the three columns
    new = (SP2 - 1 + SPM1 + SP1 - 1) / 3
    assert _loss(method, [2, -1, 1], 2, None, zero_teacher()) == pytest.approx(new, abs=1e-6)
    assert new == pytest.approx(0.584484, abs=1e-6)
    # an exemplar of the old class 0: its own column's target is the old model's 1/2 as well, not 1
    assert _loss(method, [2, -1, 1], 0, None, zero_teacher()) == pytest.approx((SP2 - 1 + SPM1 + SP1) / 3, abs=1e-6)
    # before a task end: the one-hot BCE
    assert _loss(method, [2, -1, 1], 2, None, {}) == pytest.approx((SP2 + SPM1 + SP1 - 1) / 3, abs=1e-6)


def test_the_columns_are_the_seen_classes_or_the_whole_head():
    seen = [True, False, True]  # class 1 not seen yet
    seen_only, _ = make(classes=3)
    assert _loss(seen_only, [2, -1, 1], 2, seen, zero_teacher()) == pytest.approx((SP2 - 1 + SP1 - 1) / 2, abs=1e-6)
    whole, _ = make(classes=3, columns="all")  # the official code: every column, an unseen one with target 0
    assert _loss(whole, [2, -1, 1], 2, seen, zero_teacher()) == pytest.approx((SP2 - 1 + SPM1 + SP1 - 1) / 3,
                                                                                abs=1e-6)


def test_a_stacked_client_without_a_teacher_gets_the_one_hot_targets():
    """Stacked with clients that finished a task, a client yet to finish one has a zero teacher and no old class."""
    method, _ = make(classes=3)
    state = zero_teacher()
    state["old_classes"] = torch.zeros(3, dtype=torch.bool)
    assert _loss(method, [2, -1, 1], 2, None, state) == pytest.approx((SP2 + SPM1 + SP1 - 1) / 3, abs=1e-6)


def test_replay_draws_the_exemplars():
    method, params = make(memory_size=3, replay_batch_size=2)
    state: dict = {}
    assert method.samples(SamplesContext("replay", state, torch.Generator().manual_seed(0), {}, {})).replay is None
    end_task(method, params, state, [[1, 0], [0, 1], [0.6, 0.8], [0.8, 0.6]], label=0, task=0)
    drawn = method.samples(SamplesContext("replay", state, torch.Generator().manual_seed(0), {}, {})).replay
    assert len(drawn.y) == 2 and drawn.y.tolist() == [0, 0] and drawn.task.tolist() == [0, 0]
    stored = {tuple(r) for r in rows(state)}
    assert all(tuple(round(v, 4) for v in r) in stored for r in drawn.x.tolist())


@pytest.mark.parametrize("scenario", ["task", "domain"])
def test_task_and_domain_streams_are_refused(scenario):
    with pytest.raises(ConfigError, match="class-incremental only"):
        make(scenario=scenario)
