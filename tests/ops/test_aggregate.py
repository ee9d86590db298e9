import torch

from cfl.ops.aggregate import weighted_mean
from tests.helpers import gradient_masked_mean


def test_fedavg_weights_by_sample_count():
    deltas = {"w": torch.tensor([[1.0, 0.0], [4.0, 2.0]]), "b": torch.tensor([[3.0], [-1.0]])}
    out = weighted_mean(deltas, torch.tensor([30.0, 10.0]))
    # 0.75 * client0 + 0.25 * client1
    assert torch.allclose(out["w"], torch.tensor([1.75, 0.5]))
    assert torch.allclose(out["b"], torch.tensor([2.0]))


def test_gma_masks_conflicting_coordinates():
    # coord 0: all agree (A=1); coord 1: 2 up, 1 down -> A=1/3; coord 2: 1 up, 1 down, 1 zero -> A=0
    deltas = {"w": torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, -1.0], [1.0, -4.0, 0.0]])}
    weights = torch.ones(3)
    out = gradient_masked_mean(deltas, weights, tau=0.4)
    mean = deltas["w"].mean(0)
    assert torch.allclose(out["w"], torch.tensor([1.0 * mean[0], (1 / 3) * mean[1], 0.0 * mean[2]]))
    assert torch.allclose(gradient_masked_mean(deltas, weights, tau=0.3)["w"][:2], mean[:2])


def test_gma_tau_zero_is_plain_weighted_average():
    gen = torch.Generator().manual_seed(0)
    deltas = {"w": torch.randn(5, 4, 3, generator=gen)}
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert torch.allclose(gradient_masked_mean(deltas, weights, 0.0)["w"], weighted_mean(deltas, weights)["w"])
