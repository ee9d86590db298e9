"""MAS+FL: importance of a linear model by hand, penalty value and gradient, accumulation over tasks, runs."""

import pytest
import torch

from cfl.config.schema import ConfigError
from cfl.engine.local.hooks import penalty_loss
from cfl.heads import SharedHead
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.mas import MAS, MASHyperparams
from cfl.methods.training_hooks import ClientEndContext
from cfl.models.mlp import MLP
from cfl.ops.fisher import output_norm_importance
from cfl.ops.fisher_linear import linear_layers
from cfl.validation import from_dict
from tests.conftest import changes_training, make_stream, penalty_of, run_both_paths
from tests.helpers import BatchStatNet

# The 2x2 linear model z = W x + b with W = [[1, 2], [0, -1]], b = 0, on two samples:
#   x1 = ( 1,  1): z1 = (3, -1);  d||z||^2/dW = 2 z1 x1^T = [[ 6,  6], [-2, -2]], d/db = 2 z1 = (6, -2)
#   x2 = ( 2, -1): z2 = (0,  1);  d||z||^2/dW = 2 z2 x2^T = [[ 0,  0], [ 4, -2]], d/db = 2 z2 = (0,  2)
# Omega = the mean of the absolute values: W [[3, 3], [3, 2]], b (3, 2). (The absolute value of the mean
# gradient, the batch shortcut of the authors' code, would give W [[3, 3], [1, 2]] and b (3, 0).)
W = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
X = torch.tensor([[1.0, 1.0], [2.0, -1.0]])
OMEGA_W = torch.tensor([[3.0, 3.0], [3.0, 2.0]])
OMEGA_B = torch.tensor([3.0, 2.0])
PER_SAMPLE = [(torch.tensor([[6.0, 6.0], [2.0, 2.0]]), torch.tensor([6.0, 2.0])),
              (torch.tensor([[0.0, 0.0], [4.0, 2.0]]), torch.tensor([0.0, 2.0]))]


def _linear(scale: float = 1.0):
    model = SharedHead(2, 2)
    with torch.no_grad():
        model.weight.copy_(scale * W)
        model.bias.zero_()
    return model, {k: v.detach().clone() for k, v in model.named_parameters()}


def _mas(model, batch_size=0, **kw):
    return MAS(MASHyperparams(**kw), RunInfo(3, "domain", 4, 2, 0, model, batch_size=batch_size))


def _end(mas, model, params, x, state, task=0, seed=0):
    y = torch.zeros(len(x), dtype=torch.long)
    mas.client_end(ClientEndContext("task_end", model, params, ClientData(x, y, task), state, {},
                                    torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("per_sample", [False, True], ids=["linear-shortcut", "per-sample-gradients"])
def test_importance_of_a_linear_model_is_the_mean_absolute_gradient_of_the_squared_output_norm(per_sample):
    model, params = _linear()
    assert linear_layers(model, set(params)) is not None  # the default path takes the shortcut on this model
    omega = output_norm_importance(model, params, X, 0, per_sample=per_sample)
    assert torch.allclose(omega["weight"], OMEGA_W) and torch.allclose(omega["bias"], OMEGA_B)


def test_penalty_is_lambda_omega_distance_squared_without_a_half():
    # lam 3, Omega (1, 2), w* = 0, w = (1, 1): value 3 * (1 + 2) = 9; gradient 2 * 3 * Omega * w = (6, 12)
    mas = _mas(SharedHead(2, 2), lam=3.0)
    state = {"omega": {"w": torch.tensor([1.0, 2.0])}, "anchor": {"w": torch.zeros(2)}}
    w = {"w": torch.ones(2, requires_grad=True)}
    pen = penalty_loss(mas, w, w, {}, state)
    assert float(pen.detach()) == pytest.approx(9.0)
    (grad,) = torch.autograd.grad(pen, [w["w"]])
    assert torch.allclose(grad, torch.tensor([6.0, 12.0]))
    assert float(penalty_loss(mas, state["anchor"], state["anchor"], {}, state)) == 0.0


def test_no_penalty_before_the_first_task_ends():
    assert penalty_of(_mas(SharedHead(2, 2)), {"w": torch.ones(2)}, {}, {}) is None


def test_importance_is_summed_over_tasks_and_the_anchor_is_the_latest_model():
    # task 2's model is 2 W: its logits and so its gradients double, Omega_2 = 2 Omega_1; the sum is 3 Omega_1
    model, first = _linear()
    _, second = _linear(scale=2.0)
    mas, state = _mas(model), {}
    _end(mas, model, first, X, state, task=0)
    assert torch.allclose(state["omega"]["weight"], OMEGA_W) and torch.equal(state["anchor"]["weight"], W)
    _end(mas, model, second, X, state, task=1)
    assert torch.allclose(state["omega"]["weight"], 3 * OMEGA_W) and torch.allclose(state["omega"]["bias"], 3 * OMEGA_B)
    assert torch.equal(state["anchor"]["weight"], 2 * W)


def test_importance_samples_uses_a_seeded_subset():
    model, params = _linear()
    picked = []
    for seed in range(8):
        state = {}
        _end(_mas(model, importance_samples=1), model, params, X, state, seed=seed)
        picked += [i for i, (w, b) in enumerate(PER_SAMPLE) if torch.allclose(state["omega"]["weight"], w)
                   and torch.allclose(state["omega"]["bias"], b)]
    assert len(picked) == 8 and set(picked) == {0, 1}  # one sample's |gradient| each time, both samples drawn


def test_importance_is_taken_in_eval_mode_on_the_task_head_only():
    torch.manual_seed(0)
    model = MLP(4, [8, 8], 3, num_tasks=2, multi_head=True, dropouts=[0.5, 0.5])
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(6, 4)
    a, b = output_norm_importance(model, params, x, 1), output_norm_importance(model, params, x, 1)
    assert all(torch.equal(a[k], b[k]) for k in a) and model.training  # dropout off, train mode restored
    slow = output_norm_importance(model, params, x, 1, per_sample=True)
    assert all(torch.allclose(a[k], slow[k], atol=1e-6, rtol=1e-4) for k in a)
    assert float(a["head.weight"][0].abs().sum()) == 0.0 and float(a["head.weight"][1].abs().sum()) > 0


def test_importance_of_a_batch_statistics_model_is_taken_through_its_training_batches():
    torch.manual_seed(0)
    model = BatchStatNet()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.randn(7, 1, 4, 4)
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for start in range(0, 7, 3):  # batches of 3, 3 and 1, as training sees them
        out = model(x[start : start + 3], None)
        for i in range(len(out)):
            grads = torch.autograd.grad(out[i].pow(2).sum(), list(model.parameters()), retain_graph=True)
            expected = [e + g.abs() / 7 for e, g in zip(expected, grads, strict=True)]
    state = {}
    _end(_mas(model, batch_size=3), model, params, x, state)
    for (k, _), e in zip(model.named_parameters(), expected, strict=True):
        assert torch.allclose(state["omega"][k], e, rtol=1e-4, atol=1e-7), k


def test_negative_lambda_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="method.lam"):
        from_dict({"method": {"name": "mas", "lam": -1.0}})


def _cfg(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "stream": {"name": "permuted-digits", "num_tasks": 3}, "wandb": {"mode": "disabled"}}
    base.update(kw)
    return from_dict(base)


@pytest.mark.parametrize("scenario", ["domain", "task"])
def test_batched_equals_sequential(scenario):
    runs = run_both_paths(_cfg, make_stream(scenario, num_tasks=3), method={"name": "mas", "lam": 5.0})
    assert all("omega" in runs[0].states[0].clients.get(c) for c in range(5))


def test_penalty_changes_training_after_the_first_task():
    assert changes_training(_cfg, {"name": "mas", "lam": 10.0})
