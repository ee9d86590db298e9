"""BatchNorm-statistics matching (TARGET's L2 form, MFCL's Gaussian form) on a toy model with hand values.

The toy: two BatchNorm1d layers (eps 0, unit weight, zero bias) in eval mode. The batch x = [[1, 2], [3, 6]] has
channel means [2, 4] and biased variances [1, 4]. Layer 1 keeps running mean [0, 4] and variance [1, 1], so it
outputs x - [0, 4] = [[1, -2], [3, 2]]: means [2, 0], variances [1, 4], which layer 2 (running mean [0, 0],
variance [1, 0]) sees."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cfl.ops.bn_statistics import (
    LayerStatistics,
    channel_statistics,
    gaussian_statistics_loss,
    l2_statistics_loss,
    recording_batch_statistics,
    update_momentum,
)

X = torch.tensor([[1.0, 2.0], [3.0, 6.0]], dtype=torch.float64)


def toy(second: bool = True) -> nn.Module:
    layers = [nn.BatchNorm1d(2, eps=0.0), nn.BatchNorm1d(2, eps=0.0)][: 2 if second else 1]
    model = nn.Sequential(*layers).double().eval()
    with torch.no_grad():
        model[0].running_mean.copy_(torch.tensor([0.0, 4.0]))
        model[0].running_var.copy_(torch.tensor([1.0, 1.0]))
        if second:
            model[1].running_mean.zero_()
            model[1].running_var.copy_(torch.tensor([1.0, 0.0]))
    return model


def recorded(model: nn.Module, x: torch.Tensor = X):
    with recording_batch_statistics(model) as layers:
        model(x)
    return layers


def test_the_hooks_record_each_layers_input_statistics():
    layers = recorded(toy())
    assert [s.name for s in layers] == ["0", "1"]
    torch.testing.assert_close(layers[0].mean, torch.tensor([2.0, 4.0], dtype=torch.float64))
    torch.testing.assert_close(layers[0].var, torch.tensor([1.0, 4.0], dtype=torch.float64))
    torch.testing.assert_close(layers[1].mean, torch.tensor([2.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(layers[1].var, torch.tensor([1.0, 4.0], dtype=torch.float64))


def test_l2_form_sums_the_euclidean_gaps_over_layers():
    """Layer 1: ||[1, 1] - [1, 4]|| + ||[0, 4] - [2, 4]|| = 3 + 2; layer 2: ||[1, 0] - [1, 4]|| + ||[0, 0] - [2, 0]||
    = 4 + 2; 11 in all (norms, not squares: squares would give 9 + 4 + 16 + 4)."""
    assert l2_statistics_loss(recorded(toy())).item() == pytest.approx(11.0, abs=1e-12)


def test_l2_form_blends_the_momentum_statistics():
    """Rate 1/2 with momentum means [0, 4] and variances [1, 1] on layer 1 alone: blend means [1, 4], variances
    [1, 2.5]; gaps ||[0, -1.5]|| + ||[-1, 0]|| = 2.5."""
    momentum = [(torch.tensor([0.0, 4.0], dtype=torch.float64), torch.tensor([1.0, 1.0], dtype=torch.float64))]
    assert l2_statistics_loss(recorded(toy(second=False)), momentum, 0.5).item() == pytest.approx(2.5, abs=1e-12)


def test_momentum_update_starts_at_the_batch_and_then_blends():
    layers = recorded(toy(second=False))
    first = update_momentum(layers, None, 0.9)
    torch.testing.assert_close(first[0][1], torch.tensor([1.0, 4.0], dtype=torch.float64))
    second = update_momentum(layers, [(torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))],
                             0.9)
    torch.testing.assert_close(second[0][0], torch.tensor([0.2, 0.4], dtype=torch.float64))


def test_gaussian_form_is_the_channel_mean_kl_of_the_running_gaussian_from_the_batchs():
    """Channel 0: log(1/1)/2 - (1 - (1 + 2^2) / 1) / 2 = 2; channel 1: log(4)/2 - (1 - (1 + 0) / 4) / 2 = ln 2 - 3/8;
    one layer: their mean."""
    got = gaussian_statistics_loss(recorded(toy(second=False))).item()
    assert got == pytest.approx((2 + math.log(2) - 0.375) / 2, abs=1e-7)


def test_gaussian_form_averages_over_layers():
    """Two layers of different statistics: KL 0 (batch and running N(0, 1)) and KL 1/2 (running mean 1 against the
    batch's 0: (0 - (1 - (1 + 1) / 1) / 2) = 1/2); the loss is their mean 1/4, not their sum."""
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    layers = [LayerStatistics("a", zero, one, zero, one), LayerStatistics("b", zero, one, one, one)]
    assert gaussian_statistics_loss(layers).item() == pytest.approx(0.25, abs=1e-7)


def test_gaussian_form_is_zero_where_the_statistics_match():
    model = toy(second=False)
    with torch.no_grad():
        model[0].running_mean.copy_(torch.tensor([2.0, 4.0]))
        model[0].running_var.copy_(torch.tensor([1.0, 4.0]))
    assert gaussian_statistics_loss(recorded(model)).item() == pytest.approx(0.0, abs=1e-7)


def test_conv_statistics_run_over_batch_and_space():
    """Channel 0 holds 0..3 over a 2x2 map in one image and 4..7 in the other: mean 3.5, variance 21/4."""
    x = torch.stack([torch.arange(8.0).view(2, 2, 2), torch.zeros(2, 2, 2)], dim=1)
    mean, var = channel_statistics(x)
    assert mean.tolist() == [3.5, 0.0] and var.tolist() == [5.25, 0.0]


def test_the_loss_reaches_the_input_and_the_hooks_leave():
    """The generator learns through the batch statistics: the gradient reaches x; after the block no hook remains."""
    model = toy()
    x = X.clone().requires_grad_()
    with recording_batch_statistics(model) as layers:
        model(x)
        l2_statistics_loss(layers).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(not m._forward_hooks for m in model)


def test_a_model_without_running_statistics_is_refused():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2, track_running_stats=False))
    with pytest.raises(ValueError, match="no BatchNorm layer with running statistics"):
        with recording_batch_statistics(model):
            pass


def test_a_teacher_in_training_mode_is_refused():
    """In training mode the forward moves the running statistics toward the batch before the hook reads them."""
    model = nn.Sequential(nn.BatchNorm1d(2)).double().train()
    with pytest.raises(ValueError, match="training mode"):
        recorded(model)
