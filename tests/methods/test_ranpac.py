"""RanPAC by hand (cfl/methods/ranpac.py): the federated solution equals the centralised ridge regression on the
random features ReLU(x W_rand) of the union of the clients' data (float64, 1e-8), whatever the split among three
clients and the order of two tasks; W_rand is fixed by the run's seed and the same wherever the method is built;
the model's head reads ReLU(x W_rand); and a tiny run through the engine writes the head."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import ClientData, Payload, RunInfo
from cfl.methods.ranpac import RanPAC, RanPACHyperparams, random_projection
from cfl.methods.training_hooks import ClientEndContext
from cfl.models.feature_head import FeatureHead
from cfl.models.mlp import MLP
from cfl.validation import from_dict
from tests.closed_form_rounds import federated
from tests.conftest import method_spec, stream_for, tiny_config

D, M, K, LAM = 6, 20, 3, 0.5


def built(seed: int = 0, multi: bool = False, dim: int = M, lam: float = LAM) -> tuple[RanPAC, RunInfo]:
    info = RunInfo(2, "task" if multi else "class", 3, 3, seed, FeatureHead(D, K, 2, multi))
    return RanPAC(RanPACHyperparams(projection_dim=dim, lam=lam), info), info


def task_data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randn(n, D, generator=g), torch.randint(0, K, (n,), generator=g)


TASKS = [task_data(0, 23), task_data(1, 17)]


def centralised(w_rand: torch.Tensor, x: torch.Tensor, y: torch.Tensor, lam: float = LAM) -> torch.Tensor:
    """``W_out`` ``(M, K)`` of the ridge regression on every sample at once, float64."""
    h = torch.relu(x.double() @ w_rand.double())
    onehot = torch.nn.functional.one_hot(y, K).double()
    return torch.linalg.solve(h.T @ h + lam * torch.eye(w_rand.shape[1], dtype=torch.float64), h.T @ onehot)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
@pytest.mark.parametrize("split", [0, 1, 2, 3])
def test_the_federated_solution_equals_the_centralised_ridge_on_the_union(split, order):
    method, info = built()
    tasks = [TASKS[t] for t in order]
    params, server = federated(method, info, tasks, split)
    x, y = torch.cat([x for x, _ in tasks]), torch.cat([y for _, y in tasks])
    central = centralised(method.w_rand, x, y)
    assert central.abs().max() > 0.05  # a solution far from the regulariser's zero
    weight, bias = method.solve(server, 0)
    assert weight.dtype == torch.float64 and server["gram"].dtype == torch.float64
    assert torch.allclose(weight, central.T, atol=1e-8, rtol=0)
    assert torch.equal(bias, torch.zeros(K, dtype=torch.float64))  # no intercept (the official code's)
    assert torch.allclose(params["head.weight"].double(), central.T, atol=1e-6, rtol=0)  # the float32 head
    assert torch.equal(params["head.bias"], torch.zeros(K))


def test_one_head_per_task_is_each_tasks_centralised_ridge():
    method, info = built(multi=True)
    params, server = federated(method, info, TASKS, split=5)
    for task, (x, y) in enumerate(TASKS):
        central = centralised(method.w_rand, x, y)
        assert torch.allclose(method.solve(server, task)[0], central.T, atol=1e-8, rtol=0)
        assert torch.allclose(params["head.weight"][task].double(), central.T, atol=1e-6, rtol=0)


def test_the_model_reads_relu_of_the_projected_features_and_the_upload_is_counted():
    method, info = built()
    params, server = federated(method, info, TASKS, split=0)
    x = TASKS[0][0][:5]
    logits = torch.func.functional_call(info.model, params, (x, torch.zeros(5, dtype=torch.long)))
    h = torch.relu(x.double() @ method.w_rand.double())
    assert torch.allclose(logits.double(), h @ method.solve(server, 0)[0].T, atol=1e-5)
    assert info.model.head.weight.shape == (K, M) and info.model.projection.shape == (D, M)
    up = method.client_end(ClientEndContext("round", info.model, params, ClientData(*task_data(9, 4), 0), {}, {},
                                            None))
    assert method.count_bytes(Payload("round_upload", payload=up)) == (M * M + M * K) * 8
    assert method.count_bytes(Payload("client_upload")) == 0  # no parameter, and W_rand never sent


def test_w_rand_is_fixed_by_the_seed_and_the_same_wherever_the_method_is_built():
    first = random_projection(7, D, M)
    assert first.shape == (D, M) and first.dtype == torch.float32
    assert torch.equal(first, random_projection(7, D, M))
    assert not torch.allclose(first, random_projection(8, D, M))
    infos = [RunInfo(2, "class", 3, 3, seed, FeatureHead(D, K, 2, False)) for seed in (7, 7, 8)]  # a model each
    rng = torch.random.get_rng_state()
    a, b, other = (RanPAC(RanPACHyperparams(projection_dim=M), info) for info in infos)  # two clients, another run
    assert torch.equal(torch.random.get_rng_state(), rng)  # W_rand and the new head draw nothing from the global RNG
    assert torch.equal(a.w_rand, first) and torch.equal(b.w_rand, first) and not torch.equal(other.w_rand, first)
    assert a.run_info.model.projection is a.w_rand  # the model's projection is the method's matrix
    x, y = task_data(3, 9)
    onehot = torch.nn.functional.one_hot(y, K).double()
    sa, sb = a.statistics(x.double(), onehot), b.statistics(x.double(), onehot)
    assert all(torch.equal(sa[k], sb[k]) for k in ("gram", "cross"))  # the same client data: the same upload
    wide = random_projection(0, 100, 1000)  # entries N(0, 1): 1e5 of them
    assert abs(float(wide.mean())) < 0.02 and abs(float(wide.std()) - 1) < 0.02


def test_the_projection_is_installed_once_and_refused_on_another_model():
    method, info = built()
    assert torch.equal(info.model.head.weight, torch.zeros(K, M))  # a fresh head, set by the first solve
    RanPAC(RanPACHyperparams(projection_dim=M, lam=LAM), info)  # the same matrix again: a no-op
    assert info.model.projection is method.w_rand
    with pytest.raises(ValueError, match="projected already"):
        RanPAC(RanPACHyperparams(projection_dim=M + 1, lam=LAM), info)
    with pytest.raises(ValueError, match=r"must be \(6, M\)"):
        FeatureHead(D, K, 2, False).project(torch.zeros(D + 1, M))
    with pytest.raises(ConfigError, match="pretrained backbone's head"):
        RanPAC(RanPACHyperparams(), RunInfo(2, "class", 3, 3, 0, MLP(D, [4], K, 2, False)))


def test_the_config_is_refused_without_a_backbone_and_beyond_the_bounds(tmp_path):
    base = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 3, "clients_per_round": 3,
            "rounds_per_task": 1, "wandb": {"mode": "disabled"}, "data_root": str(tmp_path)}
    with pytest.raises(ConfigError, match="runs on a frozen pretrained backbone"):
        from_dict({**base, "method": {"name": "ranpac"}})
    with pytest.raises(ConfigError, match="'method.projection_dim' must be <= 20000"):
        from_dict({**base, "method": {"name": "ranpac", "projection_dim": 20001}})
    with pytest.raises(ConfigError, match="'method.lam' must be > 0"):
        from_dict({**base, "method": {"name": "ranpac", "lam": 0.0}})
    assert METHODS["ranpac"] is RanPAC


def test_a_tiny_run_through_the_engine_writes_the_head():
    pytest.importorskip("timm", reason="the backbone models need the extra pretrained")
    cfg = tiny_config(method=method_spec("ranpac"))
    runner = Runner(cfg, stream_for("ranpac", scenario="class"))
    dim = cfg.method["projection_dim"]
    assert torch.equal(runner.model.projection, random_projection(cfg.seed, 192, dim))
    progress = runner.run()
    final = [a for a in progress.acc_matrix[-1] if a is not None]
    assert len(final) == 2 and all(math.isfinite(a) for a in final) and min(final) > 50  # 2 tasks of 3 classes
    method, server = runner.methods[0], runner.states[0].server
    weight = runner.params["head.weight"]
    assert weight.shape == (6, dim) and bool(weight.abs().sum() > 0)
    assert torch.allclose(weight.double(), method.solve(server, 0)[0], atol=1e-6, rtol=0)
    per_upload = (dim * dim + dim * 6) * 8
    assert runner.comm.upload_bytes > 0 and runner.comm.upload_bytes % per_upload == 0  # statistics only
