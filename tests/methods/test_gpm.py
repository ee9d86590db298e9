"""GPM+FL: client bases grow by the energy threshold, gradients are projected, old outputs are kept."""

import pytest
import torch
from torch import nn

from cfl.engine.local.batched import BatchedTrainer
from cfl.engine.local.hooks import projected as projected_by
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.sequential import train_sequential
from cfl.engine.local.stacking import stack_states
from cfl.engine.rounds.runner import Runner
from cfl.methods import gpm as gpm_module
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.gpm import GPM, GPMHyperparams, extend_from_gram
from cfl.methods.training_hooks import ClientEndContext
from cfl.metrics.results import method_stats
from cfl.records.client_states import MethodState
from cfl.validation import from_dict
from tests.conftest import make_stream, run_both_paths
from tests.helpers import TwoLayerNet


def _low_rank(d: int, energies: list[float], n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u0 = torch.linalg.qr(torch.randn(d, len(energies), generator=gen))[0]
    coeffs = torch.linalg.qr(torch.randn(n, len(energies), generator=gen))[0].T  # orthonormal rows
    return u0 @ (torch.tensor(energies).sqrt().unsqueeze(1) * coeffs)  # singular values sqrt(energies)


def test_basis_grows_per_the_threshold():
    a = _low_rank(10, [100.0, 25.0, 1.0], 40).double()  # energy shares .794 .198 .008
    gram = a @ a.T
    first = extend_from_gram(gram, None, eps=0.9)
    assert first.shape == (10, 2)
    assert extend_from_gram(gram, first, eps=0.9).shape == (10, 2)  # old basis holds 0.992 >= 0.9
    second = extend_from_gram(gram, first, eps=0.999)  # needs (0.999 - 0.992) / 0.008 of the rest: one more
    assert second.shape == (10, 3) and torch.allclose(second[:, :2], first)
    assert (a.float() - second @ (second.T @ a.float())).norm() < 1e-4 * a.norm()



def _gpm(model: nn.Module, eps: float) -> GPM:
    info = RunInfo(num_tasks=2, scenario="domain", num_clients=2, clients_per_round=2, seed=0, model=model,
                   protected={"fc1.weight": "linear", "fc2.weight": "linear"})
    return GPM(GPMHyperparams(eps=eps), info)


def test_projected_gradients_are_orthogonal_to_the_basis_and_old_outputs_stay():
    torch.manual_seed(0)
    model = TwoLayerNet()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x_old = _low_rank(8, [4.0, 2.0, 1.0], 30, seed=1).T * 5  # old inputs span 3 of 8 dims
    gpm = _gpm(model, eps=0.99999)
    state: dict = {}
    gpm.client_end(ClientEndContext("task_end", model, params, ClientData(x_old, torch.zeros(30), 0), state, {},
                                    torch.Generator()))
    assert state["bases"]["fc1.weight"].shape == (8, 3)
    x_new, y_new = torch.randn(16, 8), torch.randint(0, 3, (16,))
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss = nn.functional.cross_entropy(torch.func.functional_call(model, p, (x_new, None)), y_new)
    grads = dict(zip(p, torch.autograd.grad(loss, list(p.values())), strict=True))
    projected = projected_by(gpm, grads, state)
    for name, basis in state["bases"].items():
        assert (projected[name] @ basis).norm() < 1e-5 * grads[name].norm()
    assert projected["fc1.weight"].norm() > 0.3 * grads["fc1.weight"].norm()  # the step is not simply zero
    stepped = {k: params[k] - 0.5 * projected[k] for k in params}
    before = torch.func.functional_call(model, params, (x_old, None))
    after = torch.func.functional_call(model, stepped, (x_old, None))
    plain = torch.func.functional_call(model, {k: params[k] - 0.5 * grads[k] for k in params}, (x_old, None))
    assert (after - before).norm() < 1e-4 * (plain - before).norm()


def test_stack_states_zero_pads_ragged_bases():
    gpm = _gpm(TwoLayerNet(), eps=0.9)
    b2 = torch.linalg.qr(torch.randn(8, 2))[0]
    b3 = torch.linalg.qr(torch.randn(8, 3))[0]
    states = [{"bases": {"fc1.weight": b2}}, {"bases": {"fc1.weight": b3}}, {}]
    stacked = stack_states(states, gpm.computes.ragged)["bases"]
    assert stacked["fc1.weight"].shape == (3, 8, 3)
    assert torch.equal(stacked["fc1.weight"][0, :, 2], torch.zeros(8)) and stacked["fc1.weight"][2].abs().sum() == 0
    g = torch.randn(6, 8)
    padded = {"bases": {"fc1.weight": stacked["fc1.weight"][0]}}
    assert torch.allclose(projected_by(gpm, {"fc1.weight": g}, padded)["fc1.weight"], g - g @ b2 @ b2.T, atol=1e-6)


def _cfg(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": {"name": "gpm", "eps": 0.9}}
    base.update(kw)
    return from_dict(base)


@pytest.mark.parametrize("scenario", ["task", "domain"])
def test_batched_equals_sequential(scenario):
    stream = make_stream(scenario, num_tasks=3)
    runs = run_both_paths(_cfg, stream, partition={"name": "quantity", "beta": 0.5})
    clients = runs[0].states[0].clients
    widths = {clients.get(c)["bases"]["body.1.weight"].shape[1] for c in clients.ids()}
    assert len(clients) == 5 and max(widths) > 0


def test_stats_report_client_state_bytes_and_nothing_is_uploaded():
    stream = make_stream("domain", num_tasks=2)
    runner = Runner(_cfg(), stream)
    runner.run()
    stats = method_stats(runner.comm, runner.methods[0], runner.states[0])
    clients = runner.states[0].clients
    sizes = [4 * sum(b.numel() for b in clients.get(c)["bases"].values()) for c in clients.ids()]
    assert stats["client_state_bytes_max"] == max(sizes)
    assert stats["client_state_bytes_mean"] == pytest.approx(sum(sizes) / len(sizes))
    assert runner.comm.upload_bytes == 2 * 2 * 3 * runner.model_bytes


def test_eps_grows_by_eps_inc_per_task_and_stops_at_1(monkeypatch):
    """ A client's basis step of task t uses ``min(1, eps + t * eps_inc)``."""
    model = TwoLayerNet()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    gpm = GPM(GPMHyperparams(eps=0.998, eps_inc=0.001), _gpm(model, 0.9).run_info)
    used: list[float] = []
    monkeypatch.setattr(gpm_module, "extend_from_held", lambda _held, basis, eps: used.append(eps) or basis)
    for task in range(4):
        gpm.client_end(ClientEndContext("task_end", model, params, ClientData(torch.randn(5, 8), torch.zeros(5), task),
                                        {}, {}, torch.Generator()))
    assert used[::2] == pytest.approx([0.998, 0.999, 1.0, 1.0], abs=1e-12)  # two protected layers per task
    assert used[1::2] == used[::2]


@pytest.mark.parametrize("trainer", [train_sequential, BatchedTrainer()], ids=["sequential", "batched"])
def test_weight_decay_is_projected_with_the_gradient(trainer):
    """docs/methods/gpm.md: each local step projects ``g + wd * w`` (after weight decay),
    so one step moves fc1.weight by ``-lr * (g + wd w)(I - M M^T)``, nothing along the basis M. Projecting
    before the decay would move it by ``-lr * wd * w M M^T`` along M (checked below to be large)."""
    torch.manual_seed(0)
    model = TwoLayerNet()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    basis = torch.linalg.qr(torch.randn(8, 3))[0]
    states = [MethodState()]
    states[0].clients.put(0, {"bases": {"fc1.weight": basis}})
    x, y = torch.randn(6, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    lr, wd = 0.1, 0.5
    hp = Hyper(lr, 0.0, wd, 1, 6)  # one step on all 6 samples
    trained, _ = trainer(model, params, [ClientJob(0, torch.arange(6), None, 0)], x, y, 0, hp,
                         RoundMethods([_gpm(model, 0.9)], states, [{}]))
    moved = trained["fc1.weight"][0] - params["fc1.weight"]
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss = nn.functional.cross_entropy(torch.func.functional_call(model, p, (x, None)), y)
    g = torch.autograd.grad(loss, p["fc1.weight"])[0]
    decayed = g + wd * params["fc1.weight"]
    assert torch.allclose(moved, -lr * (decayed - decayed @ basis @ basis.T), atol=1e-6)
    assert (moved @ basis).norm() < 1e-6
    assert (lr * wd * params["fc1.weight"] @ basis).norm() > 0.02  # what projecting first would leave along M
