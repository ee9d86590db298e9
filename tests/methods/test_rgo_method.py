"""RGO+FL as a method: task-end state, preconditioned steps, state size, refusals, runs."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cfl.config.schema import ConfigError
from cfl.engine.local import hooks
from cfl.engine.rounds.runner import Runner
from cfl.methods.base import ClientData, ClientRound, Payload, RunInfo, StateSizing
from cfl.methods.rgo import RGO, RGOHyperparams
from cfl.methods.training_hooks import ClientEndContext
from cfl.ops.layer_inputs import layer_grams
from cfl.ops.rgo import closed_form, precondition, preconditioner
from cfl.validation import from_dict
from tests.conftest import make_stream, run_both_paths
from tests.helpers import TwoLayerNet

PROTECTED = {"fc1.weight": "linear", "fc2.weight": "linear"}


def _rgo(model: nn.Module, **kw) -> RGO:
    info = RunInfo(num_tasks=3, scenario="domain", num_clients=2, clients_per_round=2, seed=0, model=model,
                   protected=PROTECTED)
    return RGO(RGOHyperparams(**kw), info)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _end(rgo: RGO, model: nn.Module, params: dict, x: torch.Tensor, state: dict, task: int = 0) -> None:
    rgo.client_end(ClientEndContext("task_end", model, params, ClientData(x, torch.zeros(len(x)), task), state, {},
                                    torch.Generator()))


def test_task_ends_fold_each_tasks_gram_into_the_clients_preconditioner():
    torch.manual_seed(0)
    model = TwoLayerNet()
    params, rgo, state = _params(model), _rgo(model, alpha=0.5, gram="mean"), {}
    x1, x2 = torch.randn(20, 8), torch.randn(5, 8)
    _end(rgo, model, params, x1, state)
    _end(rgo, model, params, x2, state, task=1)
    grams = [layer_grams(model, params, x, 0, PROTECTED) for x in (x1, x2)]
    for name in PROTECTED:
        expected = closed_form(grams[0][name] / 20 + grams[1][name] / 5, 0.5)
        held = state["deflation"][name]
        assert held.dtype == torch.float32 and torch.allclose(torch.eye(held.shape[0]) - held, expected.float(),
                                                              atol=1e-6)


@pytest.mark.parametrize(("scale", "tolerance"), [(1.0, 1e-9), (30.0, 1e-6)])
def test_a_float64_run_keeps_the_deflation_in_float64(scale, tolerance):
    """A summed Gram, alpha 1e-3, 200 inputs spanning the 32-wide layer: ``d - trace D`` cancels to a few digits;
    stored in float32 the preconditioner's relative error was 7e-3, and NaN at inputs of size 30 (trace D rounds to
    d)."""
    torch.manual_seed(0)
    model = TwoLayerNet(inputs=32, hidden=16).double()
    params, rgo, state = _params(model), _rgo(model, alpha=1e-3, gram="sum"), {}
    x = scale * torch.randn(200, 32, dtype=torch.float64)
    _end(rgo, model, params, x, state)
    gram = layer_grams(model, params, x, 0, {"fc1.weight": "linear"})["fc1.weight"]
    want = preconditioner(gram, 1e-3)
    got = rgo.round_terms(ClientRound("preconditioner", state)).preconditioner["fc1.weight"]
    assert state["deflation"]["fc1.weight"].dtype == torch.float64 and torch.isfinite(got).all()
    assert (got - want).norm() / want.norm() < tolerance


def test_a_client_without_data_of_the_task_keeps_its_state():
    model = TwoLayerNet()
    state: dict = {}
    _end(_rgo(model), model, _params(model), torch.zeros(0, 8), state)
    assert state == {}


def test_no_state_no_rewrite_then_protected_weights_are_preconditioned_and_the_rest_kept():
    torch.manual_seed(1)
    model = TwoLayerNet()
    params, rgo = _params(model), _rgo(model, alpha=0.1)
    grads = {k: torch.randn_like(v) for k, v in params.items()}
    assert rgo.round_terms(ClientRound("preconditioner", {})).preconditioner == {}
    state: dict = {}
    _end(rgo, model, params, torch.randn(12, 8), state)
    state["deflation"].pop("fc2.weight")  # a layer without a deflation is left as it is
    out = _stepped(rgo, grads, state)
    assert torch.equal(out["fc2.weight"], grads["fc2.weight"])
    assert torch.allclose(out["fc1.weight"], precondition(grads["fc1.weight"], state["deflation"]["fc1.weight"]),
                          atol=1e-6)


def _stepped(rgo: RGO, grads: dict, state: dict) -> dict:
    """The gradients as the engine preconditions them with ``rgo.round_terms``' preconditioner."""
    matrices = rgo.round_terms(ClientRound("preconditioner", state)).preconditioner
    return {k: hooks.precondition(g, matrices[k]) if k in matrices else g for k, g in grads.items()}


def test_a_preconditioned_step_barely_moves_old_outputs():
    """10 old samples in 3 of 8 input dims: fc1's old inputs span 3 dims, fc2's (16 hidden units) at most 10."""
    torch.manual_seed(2)
    model = TwoLayerNet(hidden=16)
    params, rgo, state = _params(model), _rgo(model, alpha=1e-4, gram="sum"), {}
    x_old = torch.randn(10, 3) @ torch.randn(3, 8)
    _end(rgo, model, params, x_old, state)
    x_new, y_new = torch.randn(16, 8), torch.randint(0, 3, (16,))
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss = nn.functional.cross_entropy(torch.func.functional_call(model, p, (x_new, None)), y_new)
    grads = dict(zip(p, torch.autograd.grad(loss, list(p.values())), strict=True))
    stepped = _stepped(rgo, grads, state)
    before = torch.func.functional_call(model, params, (x_old, None))
    after = torch.func.functional_call(model, {k: params[k] - 0.5 * stepped[k] for k in params}, (x_old, None))
    plain = torch.func.functional_call(model, {k: params[k] - 0.5 * grads[k] for k in params}, (x_old, None))
    assert (after - before).norm() < 1e-3 * (plain - before).norm()


def test_state_bytes_are_a_d_by_d_per_protected_layer_and_client_in_the_models_precision():
    sizing = StateSizing(model_bytes=0, sample_bytes=0, samples_per_client=480, num_clients=125, num_tasks=10,
                         rounds=2000, clients_per_round=64,
                         protected={"a": ("linear", 784), "b": ("linear", 400), "c": ("conv", 27)})
    state = Payload("client_state", sizing=sizing)
    assert _rgo(TwoLayerNet()).count_bytes(state) == 125 * 4 * (784**2 + 400**2 + 27**2)
    assert _rgo(TwoLayerNet().double()).count_bytes(state) == 125 * 8 * (784**2 + 400**2 + 27**2)


def test_fel_is_refused():
    with pytest.raises(ConfigError, match="'method.fel: true'.*use method.fel: false"):
        RGO.check(RGOHyperparams(fel=True), SimpleNamespace())


def _cfg(method: dict, **kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": method}
    return from_dict({**base, **kw})


@pytest.mark.parametrize("execution", ["batched", "sequential"])
def test_task_1_equals_fedavg_bit_for_bit(execution):
    stream = make_stream("domain", num_tasks=1)
    runs = [Runner(_cfg({"name": name}, client_execution=execution), stream) for name in ("rgo", "fedavg")]
    for runner in runs:
        runner.run()
    rgo, fedavg = runs
    assert rgo.engine_path.path == fedavg.engine_path.path == ("stacked" if execution == "batched" else "sequential")
    assert all(torch.equal(rgo.params[k], v) for k, v in fedavg.params.items())
    assert rgo.progress.acc_matrix == fedavg.progress.acc_matrix


@pytest.mark.parametrize("scenario", ["task", "domain"])
def test_batched_equals_sequential_and_task_2_differs_from_fedavg(scenario):
    stream = make_stream(scenario, num_tasks=3)
    quantity = {"name": "quantity", "beta": 0.5}
    runs = run_both_paths(lambda **kw: _cfg({"name": "rgo", "alpha": 0.1}, **kw), stream, partition=quantity)
    clients = runs[0].states[0].clients  # every client holds a d x d per protected layer (digits-mlp 12-128-128)
    shapes = {n: d.shape for c in clients.ids() for n, d in clients.get(c)["deflation"].items()}
    shared_head = {"head.weight": (128, 128)} if scenario == "domain" else {}  # per-task heads: not protected
    assert len(clients) == 5 and shapes == {"body.1.weight": (12, 12), "body.3.weight": (128, 128), **shared_head}
    fedavg = Runner(_cfg({"name": "fedavg"}, client_execution="sequential", partition=quantity), stream)
    fedavg.run()
    assert not torch.allclose(runs[1].params["body.1.weight"], fedavg.params["body.1.weight"])
