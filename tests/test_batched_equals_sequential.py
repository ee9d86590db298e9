"""The batched trainer equals the sequential one on every registered model, ragged client sizes included.

Dropout is switched off (p = 0) in these comparisons: the two trainers draw their masks from torch's global
generator in a different order, so with dropout on they train on different masks by design. Without it they
compute the same sums in a different order (stacked/grouped products against one client's), so parameters
agree within float rounding: ``atol=1e-5, rtol=1e-4`` (measured largest differences after the two steps
below: ~1e-8 without BatchNorm, 8e-6 on resnet18-mini, whose batch statistics amplify the rounding).
"""

from __future__ import annotations

import pytest
import torch

from cfl.engine.jobs import ClientJob, Hyper, Plugins
from cfl.engine.local_batched import couples_samples, train_batched
from cfl.engine.local_sequential import train_sequential
from cfl.engine.stacked_net import StackedNet
from cfl.methods.base import MethodState
from cfl.methods.fedavg import FedAvg
from cfl.models import MODELS, ModelShape, build_model
from cfl.models.dropout import Dropout
from cfl.models.mlp import MLP

# the smallest input every registered model takes (the Mini-ImageNet ResNet's stride-2 stem needs 32x32)
IMAGE = (3, 32, 32)


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every dropout layer at p = 0 (an identity in both trainers)."""
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p, m.keep_prob = 0.0, 1.0
    return model


def assert_params_close(a: dict, b: dict) -> None:
    for k in b:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4), (k, float((a[k] - b[k]).abs().max()))


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_trains_alike_in_both_engines_with_ragged_clients(name):
    """Client sizes (6, 5) at batch 4: batches 4, 2 and 4, 1, so the batched trainer pads both last steps."""
    torch.manual_seed(0)
    model = without_dropout(build_model(name, ModelShape(IMAGE, 3, 2, True)))
    assert not list(model.buffers())  # nothing but parameters to average (BatchNorm: batch statistics only)
    x, y = torch.randn(11, *IMAGE), torch.arange(11) % 3
    jobs = [ClientJob(0, torch.arange(6), None, 1), ClientJob(1, torch.arange(6, 11), None, 2)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=2)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    plugins = Plugins([FedAvg(None, None)], [MethodState()], [{}])
    batched, _ = train_batched(model, start, jobs, x, y, 1, hp, plugins)
    sequential, _ = train_sequential(model, start, jobs, x, y, 1, hp, plugins)
    assert_params_close(batched, sequential)


def test_only_batch_norm_models_are_trained_on_unpadded_groups():
    shape = ModelShape(IMAGE, 3, 2, True)
    coupled = {name for name in MODELS if couples_samples(build_model(name, shape))}
    assert coupled == {"resnet18-mini"}


def test_the_stacked_path_refuses_layers_that_mix_samples():
    """The stacked path pads short batches whatever the model, so it must never take BatchNorm."""
    model = MLP(4, [5], 3)
    hp = Hyper(lr=0.1, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4)
    plugins = Plugins([FedAvg(None, None)], [MethodState()], [{}])
    assert StackedNet.supports(model, hp, plugins)
    model.body.insert(2, torch.nn.BatchNorm1d(5, track_running_stats=False))
    assert couples_samples(model) and not StackedNet.supports(model, hp, plugins)
