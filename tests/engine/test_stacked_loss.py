"""cfl/engine/local/stacked_loss.py: the stacked path's weighted cross-entropy in three operators, its targets by
hand, its gradient bit for bit the autograd one of ``weighted_mean(masked_cross_entropy(...))``."""

from __future__ import annotations

import math

import torch

from cfl.engine.local.stacked_loss import loss_targets, weighted_cross_entropy
from cfl.ops.losses import masked_cross_entropy, weighted_mean


def test_targets_hold_minus_the_weight_share_at_each_label() -> None:
    y = torch.tensor([[1, 0, 2]])
    w = torch.tensor([[1.0, 1.0, 0.0]])  # the third sample is padding
    expected = torch.tensor([[[0.0, -0.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    assert torch.equal(loss_targets(y, w, 3), expected)


def test_loss_by_hand_and_gradient_equal_autograd_bit_for_bit() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], requires_grad=True)  # p = (1/4, 3/4), (1/2, 1/2)
    y, w = torch.tensor([[1, 0]]), torch.tensor([[1.0, 1.0]])
    terms = loss_targets(y, w, 2)
    grad = weighted_cross_entropy(logits, terms)
    assert torch.allclose(terms.sum((1, 2)), torch.tensor([(-math.log(0.75) - math.log(0.5)) / 2]))
    # d/dlogits of the mean: (softmax - onehot) / 2 per sample
    assert torch.allclose(grad, torch.tensor([[[0.125, -0.125], [-0.25, 0.25]]]))
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 5, requires_grad=True)
    y, w = torch.randint(0, 5, (4, 6)), (torch.rand(4, 6) > 0.3).float()
    reference = weighted_mean(masked_cross_entropy(logits, y, None), w)
    expected, = torch.autograd.grad(reference.sum(), logits)
    terms = loss_targets(y, w, 5)
    assert torch.equal(weighted_cross_entropy(logits, terms), expected)
    assert torch.allclose(terms.sum((1, 2)), reference.detach(), atol=1e-6, rtol=1e-6)  # summed in another order


def test_classes_outside_the_softmax_leave_the_loss_finite_and_an_excluded_label_infinite() -> None:
    """TCE and class-incremental: logits masked to -inf outside the allowed classes (was NaN: 0 x -inf)."""
    allowed = torch.tensor([[True, True, False]])
    logits = torch.tensor([[[0.0, 0.0, 5.0], [1.0, 2.0, 3.0]]], requires_grad=True)
    y, w = torch.tensor([[0, 1]]), torch.tensor([[1.0, 0.0]])
    masked = logits.masked_fill(~allowed.unsqueeze(-2), float("-inf"))
    reference = weighted_mean(masked_cross_entropy(logits, y, allowed), w)
    expected, = torch.autograd.grad(reference.sum(), logits)
    terms = loss_targets(y, w, 3)
    grad_masked = weighted_cross_entropy(masked, terms, ~allowed.unsqueeze(-2))
    got, = torch.autograd.grad(masked, logits, grad_masked)
    assert torch.allclose(terms.sum(), torch.tensor(math.log(2.0))) and torch.equal(got, expected)
    terms = loss_targets(torch.tensor([[2, 1]]), w, 3)
    weighted_cross_entropy(masked, terms, ~allowed.unsqueeze(-2))
    assert terms.sum().item() == float("inf")
