"""``accuracy()`` (every entry of the accuracy matrix) and ``class_accuracy()`` (client forgetting), which share
one evaluation loop, on a model whose answers are known."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cfl.metrics import evaluate
from cfl.metrics.client_forgetting import class_accuracy
from cfl.metrics.evaluate import accuracy


class GivenLogits(nn.Module):
    """Logits = the input row plus the task's offset row: the answers are read off the inputs."""

    def __init__(self, offsets: torch.Tensor) -> None:
        super().__init__()
        self.offset = nn.Parameter(offsets)  # (tasks, classes)
        self.drop = nn.Dropout(0.99)  # would scramble the answers if evaluation ran in training mode

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        return self.drop(x + self.offset[task])


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


# argmax per row: 0, 1, 2, 2 (the last row's true label is 1)
LOGITS = torch.tensor([[5.0, 1.0, 0.0], [0.0, 4.0, 1.0], [0.0, 1.0, 3.0], [0.0, 2.0, 3.0]])
LABELS = torch.tensor([0, 1, 2, 1])


@pytest.fixture(params=[1, 3, 2048], ids=["chunk1", "chunk3", "default-chunk"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(evaluate, "EVAL_CHUNK", request.param)  # chunks must add up, whatever their size


@pytest.mark.usefixtures("chunk")
def test_domain_incremental_counts_the_argmax_hits():
    model = GivenLogits(torch.zeros(1, 3))
    assert accuracy(model, _params(model), LOGITS, LABELS, 0) == 75.0  # 3 of 4 by hand
    assert not model.training
    assert accuracy(model, _params(model), LOGITS, torch.tensor([1, 0, 0, 0]), 0) == 0.0
    assert accuracy(model, _params(model), LOGITS, LOGITS.argmax(1), 0) == 100.0


@pytest.mark.usefixtures("chunk")
def test_task_incremental_scores_each_task_with_its_own_head():
    # task 1's head adds 10 to class 1: every row then answers 1
    model = GivenLogits(torch.tensor([[0.0, 0.0, 0.0], [0.0, 10.0, 0.0]]))
    assert accuracy(model, _params(model), LOGITS, LABELS, 0) == 75.0
    assert accuracy(model, _params(model), LOGITS, LABELS, 1) == 50.0  # labels 1 at rows 1 and 3
    other = {"offset": torch.tensor([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]])}  # the params given are the ones used
    assert accuracy(model, other, LOGITS, LABELS, 1) == 25.0


@pytest.mark.usefixtures("chunk")
def test_class_incremental_argmax_only_over_seen_classes():
    # six classes; classes 3-5 not seen yet but with the largest logits
    logits = torch.cat([LOGITS, torch.full((4, 3), 9.0)], 1)
    model = GivenLogits(torch.zeros(1, 6))
    seen = torch.tensor([True, True, True, False, False, False])
    assert accuracy(model, _params(model), logits, LABELS, 0, seen) == 75.0
    assert accuracy(model, _params(model), logits, LABELS, 0) == 0.0  # unmasked: every answer is class 3
    only_1 = torch.tensor([False, True, False, False, False, False])
    assert accuracy(model, _params(model), logits, LABELS, 0, only_1) == 50.0


def test_empty_test_set_scores_zero():
    model = GivenLogits(torch.zeros(1, 3))
    assert accuracy(model, _params(model), LOGITS[:0], LABELS[:0], 0) == 0.0


@pytest.mark.usefixtures("chunk")
def test_class_accuracy_per_class_with_nan_for_absent_classes():
    model = GivenLogits(torch.zeros(1, 4))
    logits = torch.cat([LOGITS, torch.zeros(4, 1)], 1)  # class 3: no test sample
    per_class = class_accuracy(model, _params(model), logits, LABELS, 0, 4)
    # class 0: row 0 right; class 1: row 1 right, row 3 answered 2; class 2: row 2 right
    assert per_class[:3].tolist() == [100.0, 50.0, 100.0] and per_class[3].isnan()
    seen = torch.tensor([True, True, False, False])  # row 2 then answers 1, row 3 answers 1
    assert class_accuracy(model, _params(model), logits, LABELS, 0, 4, seen)[:3].tolist() == [100.0, 100.0, 0.0]
