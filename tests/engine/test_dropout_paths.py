"""Every registered model trains with its dropout on in every engine path: stacked (where the model allows it),
vmap with two clients at once, and sequential. The dropout masks come from torch's global generator, so a
path's result is a function of the generator's state (bit for bit: what a resumed run relies on), and each
client draws its own masks. (The vmap path once crashed on AlexNet whenever two clients trained at once:
its dropout asked a non-contiguous activation for its memory format inside ``vmap``.)"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.func import vmap

from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.sequential import train_sequential
from cfl.engine.local.stacked_net import StackedNet
from cfl.methods.fedavg import FedAvg
from cfl.models import MODELS, ModelShape, build_model
from cfl.models.dropout import Dropout
from cfl.pretrained.backbones import is_backbone
from cfl.records.client_states import MethodState
from tests.engine.test_batched_equals_sequential import IMAGE, smallest_image


@functools.cache
def _shape(name: str) -> ModelShape:
    """Model ``name``'s smallest square input, 3 classes per head, 2 tasks."""
    return ModelShape(smallest_image(name), 3, 2, True)


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(name, _shape(name))


def _has_dropout(model: torch.nn.Module) -> bool:
    return any(isinstance(m, Dropout) and m.p > 0 for m in model.modules())


def _paths(name: str) -> list[str]:
    stacked = [] if StackedNet.model_refusal(_model(name)) else ["stacked"]
    return [*stacked, "vmap", "sequential"]


#: the registered models with dropout (the others train as they are in tests/engine/test_batched_equals_sequential.py)
WITH_DROPOUT = [name for name in MODELS  # a pretrained backbone's model is a head on features (no dropout)
                if not is_backbone(name) and _has_dropout(build_model(name, ModelShape(IMAGE, 3, 2, True)))]
CASES = [(name, path) for name in WITH_DROPOUT for path in _paths(name)]


def _train(name: str, path: str, rng: int) -> dict[str, torch.Tensor]:
    """Model ``name`` trained on ``path`` for one local epoch by three clients at once (blocks of 3): two
    twins (the same 6 samples in the same order) and one of 5 samples (a short last batch at batch 4), with
    the global generator seeded with ``rng`` (the model's initialisation seeded apart)."""
    model = _model(name)
    shape = _shape(name).input_shape
    x, y = torch.randn(11, *shape, generator=torch.Generator().manual_seed(1)), torch.arange(11) % 3
    twin = torch.arange(6)
    jobs = [ClientJob(0, twin, None, 1), ClientJob(1, twin, None, 1), ClientJob(2, torch.arange(6, 11), None, 2)]
    hp = Hyper(lr=0.05, momentum=0.0, weight_decay=0.0, local_epochs=1, batch_size=4, client_block=3,
               path="" if path == "sequential" else path)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    round_methods = RoundMethods([FedAvg(None, None)], [MethodState()], [{}])
    torch.manual_seed(rng)
    trainer = train_sequential if path == "sequential" else train_batched
    return trainer(model, start, jobs, x, y, 1, hp, round_methods)[0]


def test_the_models_without_dropout_are_trained_as_they_are_elsewhere():
    """A model without dropout layers is the same model with dropout on or off: the engine comparisons of
    tests/engine/test_batched_equals_sequential.py, which switch dropout off, train it as it is in every path."""
    assert {"mlp", "alexnet"} <= set(WITH_DROPOUT)
    for name in {n for n in MODELS if not is_backbone(n)} - set(WITH_DROPOUT):
        assert not any(isinstance(m, Dropout) for m in build_model(name, ModelShape(IMAGE, 3, 2, True)).modules())
    assert {("alexnet", "vmap"), ("alexnet", "stacked"), ("mlp", "stacked"), ("mlp", "vmap")} <= set(CASES)


@pytest.mark.parametrize(("name", "path"), CASES)
def test_every_model_trains_with_dropout_on_in_every_path(name, path):
    """Finite; a function of the generator's state, bit for bit; and each client draws its own masks: the
    twins, trained alike but for their masks, differ (so dropout acted)."""
    first = _train(name, path, rng=7)
    assert all(bool(torch.isfinite(v).all()) for v in first.values())
    assert any(not torch.equal(v[0], v[1]) for v in first.values())
    again = _train(name, path, rng=7)
    assert all(torch.equal(first[k], again[k]) for k in first)


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_under_vmap_takes_non_contiguous_activations(p):
    """A (clients, batch, channels, H, W) activation whose per-client view is not contiguous (as a grouped
    convolution under ``vmap`` leaves it): each client gets its own mask, kept units scaled by 1/keep, the
    kept share near the keep probability; and the mask does not depend on the memory layout (the same draw
    as for a contiguous copy of the input)."""
    layer = Dropout(p).train()
    x = torch.rand(8, 3, 2, 16, 16).add_(0.5).transpose(0, 1)  # (3 clients, 8, 2, 16, 16), strided per client
    torch.manual_seed(3)
    out = vmap(layer, randomness="different")(x)
    torch.manual_seed(3)
    contiguous = vmap(layer, randomness="different")(x.contiguous())
    assert torch.equal(out, contiguous)
    ratio = out / x
    assert bool(((ratio == 0) | torch.isclose(ratio, torch.tensor(1 / layer.keep_prob))).all())
    kept = (ratio > 0).float().mean((1, 2, 3, 4))
    assert bool(((kept - layer.keep_prob).abs() < 0.03).all()), kept  # 4096 units per client
    assert not torch.equal(ratio[0], ratio[1]) and not torch.equal(ratio[1], ratio[2])
