"""The data-free methods' client step losses through a cfl model (``functional_call``): TARGET's and MFCL's, on an
all-zero model (every logit 0: hand values in ln 2) and against the model's own features."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.models.mlp import MLP
from cfl.ops.data_free_clients import ClassSets, mfcl_client_loss, target_client_loss
from cfl.ops.features import head_features

L2 = math.log(2)
CLASSES = ClassSets(new=torch.tensor([False, False, True, True]), old=torch.tensor([True, True, False, False]))
X, Y = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), torch.tensor([2, 3, 2])
X_SYN = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))


def model_and_params(zero: bool, seed: int = 0) -> tuple[MLP, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = MLP(5, [6], 4, 1, False)
    params = {k: (torch.zeros_like(v) if zero else v.detach().clone()).requires_grad_() for k, v in
              model.named_parameters()}
    return model, params


def test_target_on_zero_logits():
    """CE over 2 new classes: ln 2; soft-CE of the uniform old-class teacher against the uniform student: ln 2;
    total ln 2 + 25 ln 2."""
    model, params = model_and_params(zero=True)
    parts = target_client_loss(model, params, {k: v.detach() for k, v in params.items()}, X, Y, X_SYN, CLASSES, 0)
    assert parts["ce"].item() == pytest.approx(L2) and parts["kd"].item() == pytest.approx(L2)
    assert parts["total"].item() == pytest.approx(26 * L2)


def test_target_old_model_gets_no_gradient():
    model, params = model_and_params(zero=False)
    _, old = model_and_params(zero=False, seed=1)
    target_client_loss(model, params, old, X, Y, X_SYN, CLASSES, 0)["total"].backward()
    assert all(v.grad is None for v in old.values()) and params["head.weight"].grad.abs().sum() > 0


def test_mfcl_on_zero_logits():
    """new: CE over 2 new classes ln 2; ft: CE over 4 seen classes ln 4 (synthetic labels: argmax of zeros over the
    old classes = class 0); kd: the same model on both sides, 0."""
    model, params = model_and_params(zero=True)
    parts = mfcl_client_loss(model, params, {k: v.detach() for k, v in params.items()}, X, Y, X_SYN, CLASSES, 0)
    assert parts["new"].item() == pytest.approx(L2) and parts["ft"].item() == pytest.approx(2 * L2)
    assert parts["kd"].item() == 0 and parts["total"].item() == pytest.approx(3 * L2)


def test_mfcl_distils_the_features_through_the_old_head():
    """kd = mean over samples and old classes of (W_old (f - f_old))^2, features read independently."""
    model, params = model_and_params(zero=False)
    _, old = model_and_params(zero=False, seed=1)
    x_all = torch.cat([X, X_SYN])
    f, _ = head_features(model, params, x_all, 0)
    f_old, _ = head_features(model, old, x_all, 0)
    want = (((f - f_old) @ old["head.weight"].T)[:, :2] ** 2).mean()
    parts = mfcl_client_loss(model, params, old, X, Y, X_SYN, CLASSES, 0)
    assert parts["kd"].item() == pytest.approx(want.item(), rel=1e-5)
    parts["total"].backward()
    assert all(v.grad is None for v in old.values())
