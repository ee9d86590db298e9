"""A classifier set in closed form as a plugin (docs/plugins.md, "A classifier in closed form"): the guide's SLDA
example (docs/examples/slda.py) is one class and one ``@register`` on ``cfl.plugin.ClosedFormHead``; its head is
the hand-computed LDA of a 1-D case and, federated over three clients and two tasks in either order, LDA on the
union of their data (float64, 1e-8); through the engine it needs no model registration and no learning rate,
trains nothing and says why it runs on the sequential path."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import cfl.plugin
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import RunInfo
from cfl.models import MODELS
from cfl.models.feature_head import FeatureHead
from cfl.validation import from_dict
from tests.closed_form_rounds import federated
from tests.conftest import make_stream
from tests.helpers import load_plugin_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "slda.py"
D, K = 5, 3


@pytest.fixture(autouse=True)
def _registry_restored():
    """Loading the example registers ``slda``; later tests must not see it."""
    with METHODS.preserved():
        yield


def _slda(eps: float = 1e-4, multi: bool = False, features: int = D, classes: int = K):
    module = load_plugin_file(EXAMPLE)
    info = RunInfo(2, "task" if multi else "class", 3, 3, 0, FeatureHead(features, classes, 2, multi))
    return module.SLDA(module.SLDAHyperparams(shrinkage=eps), info), info


def test_the_guide_shows_the_example_verbatim_and_it_is_one_registration_on_the_public_base():
    assert EXAMPLE.read_text() in (ROOT / "docs" / "plugins.md").read_text()
    models = set(MODELS)
    module = load_plugin_file(EXAMPLE)
    assert METHODS["slda"] is module.SLDA and issubclass(module.SLDA, cfl.plugin.ClosedFormHead)
    assert set(MODELS) == models  # no model to register: the run's model is the backbone's FeatureHead
    assert "ClosedFormHead" in cfl.plugin.__all__


def test_a_one_dimensional_case_by_hand():
    """Class 0 at 0 and 2, class 1 at 4 and 6: means 1 and 5, residuals -1, 1, -1, 1, covariance 1; with eps = 0.5
    the shrunk covariance is 0.5 * 1 + 0.5 = 1, so w = (1, 5) and b = -(1 * 1, 5 * 5) / 2 = (-0.5, -12.5)."""
    method, info = _slda(eps=0.5, features=1, classes=2)
    x, y = torch.tensor([[0.0], [2.0], [4.0], [6.0]]), torch.tensor([0, 0, 1, 1])
    params, _ = federated(method, info, [(x, y)], split=0)
    assert torch.allclose(params["head.weight"].double(), torch.tensor([[1.0], [5.0]], dtype=torch.float64))
    assert torch.allclose(params["head.bias"].double(), torch.tensor([-0.5, -12.5], dtype=torch.float64))


def _task(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(200 + seed)
    return torch.randn(n, D, generator=g) * torch.arange(1, D + 1), torch.randint(0, K, (n,), generator=g)


def centralised_lda(x: torch.Tensor, y: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """LDA on every sample at once: the class means, the covariance of the residuals about them, shrunk."""
    x = x.double()
    means = torch.stack([x[y == k].mean(0) for k in range(K)])
    residuals = x - means[y]
    covariance = residuals.T @ residuals / len(x)
    precision = torch.linalg.inv((1 - eps) * covariance + eps * torch.eye(D, dtype=torch.float64))
    weight = means @ precision
    return weight, -0.5 * (weight * means).sum(1)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
@pytest.mark.parametrize("split", [0, 1, 2])
def test_the_federated_head_is_lda_on_the_union_of_the_clients_data(split, order):
    tasks = [_task(0, 31), _task(1, 19)]
    method, info = _slda(eps=0.1)
    # float32 heads (the model's dtype) of a float64 solve: compared at the solve, to 1e-8
    _, server = federated(method, info, [tasks[i] for i in order], split)
    weight, bias = method.solve(server, 0)
    x, y = torch.cat([t[0] for t in tasks]), torch.cat([t[1] for t in tasks])
    central_w, central_b = centralised_lda(x, y, 0.1)
    assert torch.allclose(weight, central_w, atol=1e-8, rtol=0) and torch.allclose(bias, central_b, atol=1e-8, rtol=0)


def _cfg(**kw):
    data = {"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "class"}, "num_clients": 4,
            "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8, "wandb": {"mode": "disabled"},
            "model": {"name": "vit-ti16", "weights": "random", "image_size": 32, "train": "head"},
            "method": {"name": "slda"}}
    return from_dict({**data, **kw})


def test_through_the_engine_it_trains_nothing_and_writes_the_solved_head():
    pytest.importorskip("timm", reason="the backbone models need the extra pretrained")
    load_plugin_file(EXAMPLE)
    runner = Runner(_cfg(), make_stream(scenario="class", dim=192, model="vit-ti16"))
    assert runner.engine_path.path == "sequential" and "closed form" in runner.engine_path.reason
    progress = runner.run()
    final = [a for a in progress.acc_matrix[-1] if a is not None]
    assert len(final) == 2 and all(math.isfinite(a) for a in final) and min(final) > 50  # 2 tasks of 3 classes
    method, server = runner.methods[0], runner.states[0].server
    weight, bias = method.solve(server, 0)
    assert torch.allclose(runner.params["head.weight"].double(), weight, atol=1e-5, rtol=1e-5)
    assert torch.allclose(runner.params["head.bias"].double(), bias, atol=1e-5, rtol=1e-5)
    per_upload = (K * 2 * 192 + K * 2 + 192 * 192) * 8  # sums (6, 192), counts (6,), scatter (192, 192)
    assert runner.comm.upload_bytes > 0 and runner.comm.upload_bytes % per_upload == 0  # statistics only


def test_a_learning_rate_is_refused_with_the_default_to_set_over_a_config_file():
    load_plugin_file(EXAMPLE)
    with pytest.raises(cfl.plugin.ConfigError, match=r"'lr: 0.05' has no effect with 'method.name: slda'.*"
                                                      r"--set lr=0.01"):
        _cfg(lr=0.05)
