"""``method.class_mask`` of the pretrained methods by hand: ``current`` (the official code's: the softmax over the
sample's own task's classes) and ``seen`` (every class seen so far), and each method's default."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from cfl.methods import METHODS
from cfl.methods.class_mask import ClassMasked
from cfl.methods.training_hooks import LossContext
from cfl.ops.losses import current_task_cross_entropy, masked_cross_entropy, task_class_table

TASKS = ((0, 1), (2, 3))


def test_the_current_mask_is_the_softmax_over_the_samples_own_task_by_hand():
    logits = torch.tensor([[1.0, 0.0, 5.0, 5.0], [9.0, 9.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    y, task, weight = torch.tensor([0, 2, 0]), torch.tensor([0, 1, 0]), torch.tensor([1.0, 1.0, 0.0])
    table = task_class_table(TASKS, 4)
    assert table.tolist() == [[True, True, False, False], [False, False, True, True]]
    ce = current_task_cross_entropy(logits, y, task, weight, table)
    # sample 0 (task 0): -log(e^1 / (e^1 + e^0)); sample 1 (task 1): -log(e^2 / (e^2 + e^0)); padding: 0
    assert ce.tolist() == pytest.approx([math.log(1 + math.exp(-1)), math.log(1 + math.exp(-2)), 0.0])
    seen = masked_cross_entropy(logits, y, torch.ones(4, dtype=torch.bool))  # the old classes count: larger
    assert (seen[:2] > ce[:2] + 1).all()


class _Masked(ClassMasked):
    def __init__(self, mask: str, scenario: str = "class") -> None:
        self.hparams = SimpleNamespace(class_mask=mask)
        self.run_info = SimpleNamespace(scenario=scenario, task_classes=TASKS)


def test_the_task_loss_follows_the_option_and_seen_is_todays_cross_entropy():
    logits, y, task = torch.randn(3, 4), torch.tensor([2, 3, 2]), torch.ones(3, dtype=torch.long)
    weight, allowed = torch.ones(3), torch.ones(4, dtype=torch.bool)
    ctx = LossContext("task", {}, None, task, weight, {}, {}, None, logits, y, allowed)
    assert torch.equal(_Masked("seen").loss(ctx).task, masked_cross_entropy(logits, y, allowed))
    only_task = masked_cross_entropy(logits, y, torch.tensor([False, False, True, True]))
    assert torch.allclose(_Masked("current").loss(ctx).task, only_task)
    # task- and domain-incremental: one mask (the run's own)
    assert torch.equal(_Masked("current", "task").loss(ctx).task, masked_cross_entropy(logits, y, allowed))


@pytest.mark.parametrize("name", ["l2p", "codap", "fedcprompt", "lorm"])
def test_the_methods_whose_official_code_trains_on_the_current_task_default_to_it(name):
    method = METHODS[name]
    assert method.Hyperparams().class_mask == "current" and issubclass(method, ClassMasked)
