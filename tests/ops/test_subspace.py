"""Subspace helpers: projection, energy threshold, basis extension, layer input matrices (linear and conv)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cfl.ops.layer_inputs import conv_patches, layer_grams
from cfl.ops.subspace import energy_rank, energy_target, extend_basis, gram_spectrum, project_out, residual
from tests.helpers import layer_inputs


def _orthonormal(d: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))[0]


def test_projection_removes_the_old_subspace_component_and_keeps_the_rest():
    basis = _orthonormal(10, 3)
    old_inputs = basis @ torch.randn(3, 20, dtype=torch.float64)  # X_old inside span(O)
    update = torch.randn(5, 10, dtype=torch.float64)
    projected = project_out(update, basis)
    assert (projected @ old_inputs).norm() / update.norm() < 1e-5
    assert (update @ old_inputs).norm() / update.norm() > 0.1  # the check can fail
    outside = torch.eye(10, dtype=torch.float64) - basis @ basis.T
    assert torch.allclose(projected @ outside, update @ outside)


def test_conv_update_is_projected_in_im2col_order():
    basis = _orthonormal(2 * 3 * 3, 4)
    update = torch.randn(5, 2, 3, 3, dtype=torch.float64)
    flat = update.view(5, -1)
    assert torch.allclose(project_out(update, basis), (flat - flat @ basis @ basis.T).view(5, 2, 3, 3))


def test_zero_padded_basis_projects_the_same():
    basis = _orthonormal(8, 3)
    padded = torch.cat([basis, torch.zeros(8, 2, dtype=torch.float64)], 1)
    update = torch.randn(4, 8, dtype=torch.float64)
    assert torch.allclose(project_out(update, basis), project_out(update, padded))


def test_energy_rank_on_a_hand_built_spectrum():
    s = torch.tensor([3.0, 2.0, 1.0, 0.5])  # energies 9, 4, 1, 0.25 of 14.25: cumulative .632 .912 .982 1
    assert [energy_rank(s, eps) for eps in (0.5, 0.9, 0.95, 0.99, 1.0)] == [1, 2, 3, 4, 4]
    # FOT/GPM with an old basis: residual share r = 0.5 -> keep (0.96 - 0.5) / 0.5 = 0.92 of the new energy
    assert energy_target(0.96, 0.5) == pytest.approx(0.92)
    assert energy_rank(s, 0.96, residual_ratio=0.5) == 3
    # the old basis already holds eps (1 - r = 0.97 >= 0.96): nothing is added, unless the quirk forces one
    assert energy_rank(s, 0.96, residual_ratio=0.03) == 0
    assert energy_rank(s, 0.96, residual_ratio=0.03, at_least_one=True) == 1
    assert energy_rank(torch.zeros(3), 0.9) == 0


def test_extend_basis_is_orthonormal_keeps_old_columns_and_skips_dependent_ones():
    old = _orthonormal(6, 2, seed=1)
    new = torch.randn(6, 2, dtype=torch.float64)
    ext = extend_basis(old, new)
    assert ext.shape == (6, 4)
    assert torch.allclose(ext.T @ ext, torch.eye(4, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(ext[:, :2], old)
    assert residual(new, ext).norm() < 1e-10
    dependent = extend_basis(ext, old[:, :1] + ext[:, 3:4])  # inside the span: adds nothing
    assert dependent.shape == (6, 4)
    assert extend_basis(None, new).shape == (6, 2)


def test_gram_spectrum_matches_svd():
    a = torch.randn(5, 30, dtype=torch.float64)
    u, s = gram_spectrum(a @ a.T)
    s_ref = torch.linalg.svdvals(a)
    assert torch.allclose(s, s_ref)
    assert torch.allclose((u.T @ a).norm(dim=1), s_ref)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=2, padding=1, dilation=1)
        self.fc = nn.Linear(3 * 3 * 3, 4)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_layer_inputs_give_linear_inputs_and_conv_patches_in_weight_order():
    torch.manual_seed(0)
    net = _Net()
    params = dict(net.named_parameters())
    x = torch.randn(5, 2, 6, 6)
    protected = {"conv.weight": "conv", "fc.weight": "linear"}
    mats = layer_inputs(net, params, x, 0, protected, chunk=2)
    assert mats["conv.weight"].shape == (18, 5 * 9) and mats["fc.weight"].shape == (27, 5)
    w = params["conv.weight"].detach()
    out = (w.view(3, -1) @ mats["conv.weight"]).view(3, 5, 9).transpose(0, 1).reshape(5, 3, 3, 3)
    assert torch.allclose(out, F.conv2d(x, w, stride=2, padding=1), atol=1e-5)
    hidden = torch.relu(net.conv(x)).flatten(1).detach()
    assert torch.allclose(mats["fc.weight"], hidden.T, atol=1e-6)
    grams = layer_grams(net, params, x, 0, protected, chunk=3)
    assert torch.allclose(grams["fc.weight"], (hidden.T @ hidden).double(), atol=1e-4)


@pytest.mark.parametrize("conv", [nn.Conv2d(2, 3, 3, padding="same", dilation=2, bias=False),
                                  nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect", bias=False),
                                  nn.Conv2d(2, 3, (2, 3), stride=(1, 2), padding=(0, 1), bias=False)])
def test_conv_patches_reproduce_the_convolution(conv):
    x = torch.randn(2, 2, 7, 7)
    cols = conv_patches(conv, x)
    out = conv(x).detach()
    got = (conv.weight.detach().view(3, -1) @ cols).view(3, 2, -1).transpose(0, 1)
    assert torch.allclose(got, out.flatten(2), atol=1e-5)


def test_grouped_conv_is_refused():
    with pytest.raises(ValueError, match="groups"):
        conv_patches(nn.Conv2d(4, 4, 3, groups=2), torch.randn(1, 4, 5, 5))


def test_train_mode_inputs_use_dropout_and_the_model_mode_is_restored():
    net = nn.Sequential(nn.Dropout(0.5), nn.Linear(6, 2))
    model = _TaskIgnoring(net)
    params = dict(model.named_parameters())
    x = torch.ones(4, 6)
    model.train()
    evaluated = layer_inputs(model, params, x, 0, {"net.1.weight": "linear"})["net.1.weight"]
    assert torch.equal(evaluated, x.T) and model.training
    model.eval()
    trained = layer_inputs(model, params, x, 0, {"net.1.weight": "linear"}, train_mode=True)["net.1.weight"]
    assert (trained == 0).any() and not model.training


class _TaskIgnoring(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return self.net(x)
