"""FedWeIT's client regularisers on a hand-computed layer, as the official code sums them.

One decomposed layer ``l`` with 1 output unit and 2 inputs: base (2, -2); mask logits 0 (task 0, gate 1/2) and
ln 3 (task 1, gate 3/4); A^(0) = (1, 0), A^(1) = (0, -1). Weights: lambda_l1 0.1, lambda_l2 10, lambda_mask 0.2,
wd 0.01. Task 0's stored weight B * 1/2 + A^(0) = (2, -1)."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.ops.fedweit_losses import (
    RegulariserWeights,
    drift_anchors,
    drift_loss,
    layer_regulariser,
    regulariser,
    sparsity_loss,
)

D = torch.float64
L3 = math.log(3)
W = RegulariserWeights(lambda_l1=0.1, lambda_l2=10.0, lambda_mask=0.2, wd=0.01)


def params() -> dict[str, torch.Tensor]:
    return {"l.base": torch.tensor([[2.0, -2.0]], dtype=D, requires_grad=True),
            "l.mask": torch.tensor([[0.0], [L3]], dtype=D, requires_grad=True),
            "l.adaptive": torch.tensor([[[1.0, 0.0]], [[0.0, -1.0]]], dtype=D, requires_grad=True)}


ANCHOR = torch.tensor([[[1.0, 0.0]]], dtype=D)  # 1 past task; the composed (2, -1) is (1, -1) away from it


def test_anchors_are_the_past_composed_weights():
    anchors = drift_anchors(params(), ["l"], 1)
    assert torch.allclose(anchors["l"], torch.tensor([[[2.0, -1.0]]], dtype=D))
    assert not anchors["l"].requires_grad
    assert drift_anchors(params(), ["l"], 0)["l"].shape == (0, 1, 2)


def test_first_task_by_hand():
    # L1: 0.1 * |A0| = 0.1, mask 0.2 * |0| = 0; decay 0.01 * (|A0|^2/2 + 0 + |B|^2/2) = 0.01 * (0.5 + 4)
    assert layer_regulariser(params(), "l", 0, None, W).item() == pytest.approx(0.1 + 0.045)


def test_second_task_by_hand_code_form():
    # L1: 0.1 * (|A1| + |A0|) = 0.2 and 0.2 * ln 3; decay 0.01 * (|A1|^2/2 + (ln 3)^2/2), none on the base;
    # drift: 10 * ||(2, -1) - (1, 0)||^2 / 2 = 10
    expected = 0.2 + 0.2 * L3 + 0.01 * (0.5 + L3**2 / 2) + 10.0
    assert layer_regulariser(params(), "l", 1, ANCHOR, W).item() == pytest.approx(expected)


def test_second_task_by_hand_paper_norm():
    """``halved=False``: the paper's squared norm, twice the code's l2_loss, in drift and decay."""
    w = RegulariserWeights(lambda_l1=0.1, lambda_l2=10.0, lambda_mask=0.2, wd=0.01, halved=False)
    expected = 0.2 + 0.2 * L3 + 0.01 * (1.0 + L3**2) + 20.0
    assert layer_regulariser(params(), "l", 1, ANCHOR, w).item() == pytest.approx(expected)


def test_drift_moves_the_base_and_past_adaptive_only_where_asked():
    """The code trains only the base against drift (past A detached); the paper's dA^(i) moves A^(0) too.
    d/dB of 10 * ||B/2 + A0 - anchor||^2 / 2 = 10 * (1, -1) * 1/2 = (5, -5); d/dA0 = 10 * (1, -1) + L1 0.1 * sign."""
    p = params()
    layer_regulariser(p, "l", 1, ANCHOR, W).backward()
    assert torch.allclose(p["l.base"].grad, torch.tensor([[5.0, -5.0]], dtype=D))
    assert torch.equal(p["l.adaptive"].grad[0], torch.zeros(1, 2, dtype=D))
    assert torch.equal(p["l.mask"].grad[0], torch.zeros(1, dtype=D))  # the past mask stays fixed
    p = params()
    w = RegulariserWeights(lambda_l1=0.1, lambda_l2=10.0, lambda_mask=0.2, wd=0.01, past_adaptive_trained=True)
    layer_regulariser(p, "l", 1, ANCHOR, w).backward()
    assert torch.allclose(p["l.adaptive"].grad[0], torch.tensor([[10.1, -10.0]], dtype=D))


def test_drift_is_zero_at_the_anchor_and_sums_tasks():
    p = params()
    anchors = drift_anchors(p, ["l"], 2)["l"]
    assert drift_loss(p["l.base"], p["l.mask"], p["l.adaptive"], anchors, 10.0).item() == 0.0
    moved = anchors + torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]], dtype=D)  # off by 1 and by 2: (1 + 4) / 2 * 10
    assert drift_loss(p["l.base"], p["l.mask"], p["l.adaptive"], moved, 10.0).item() == pytest.approx(25.0)


def test_sparsity_by_hand():
    a = torch.tensor([[1.0, -2.0]], dtype=D)
    m = torch.tensor([-3.0], dtype=D)
    assert sparsity_loss(a, m, 0.1, 0.2).item() == pytest.approx(0.3 + 0.6)


def test_regulariser_sums_layers_and_needs_the_past_anchors():
    p = {**params(), **{k.replace("l.", "k."): v for k, v in params().items()}}
    one = layer_regulariser(params(), "l", 1, ANCHOR, W).item()
    assert regulariser(p, ["l", "k"], 1, {"l": ANCHOR, "k": ANCHOR}, W).item() == pytest.approx(2 * one)
    with pytest.raises(ValueError, match="stored weights of 1 past task"):
        layer_regulariser(params(), "l", 1, None, W)
