"""SCAFFOLD, FedDyn and DER++: hand-computed client and server updates, the reservoir, and the path the
engine takes (SCAFFOLD and FedDyn stacked, said on stderr)."""

import pytest
import torch

from cfl.engine.local.hooks import penalty_terms
from cfl.engine.rounds.runner import Runner
from cfl.methods.base import LocalTraining, RunInfo, Step
from cfl.methods.derpp import DERpp, DERppHyperparams
from cfl.methods.feddyn import FedDyn, FedDynHyperparams
from cfl.methods.scaffold import Scaffold
from cfl.methods.server_hooks import ServerEvent, ServerUpdate
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.ops.counter_random import StepRandom
from cfl.validation import from_dict
from tests.conftest import carry_start_of, make_stream, penalty_of


def _info(num_clients=4, clients_per_round=2, model=None):
    return RunInfo(1, "domain", num_clients, clients_per_round, 0, model or torch.nn.Identity(), num_classes=2,
                   input_shape=(1,), batch_size=2)


def test_scaffold_option_ii_control_variates_by_hand():
    m = Scaffold(None, _info())
    server = {}
    m.server_event(ServerEvent("start", server, 0, {"w": torch.tensor([1.0, 2.0])}))
    assert server["c"]["w"].tolist() == [0.0, 0.0]
    server["c"] = {"w": torch.tensor([0.5, -1.0])}
    state = {"c": {"w": torch.tensor([0.25, 0.0])}}
    (term,) = penalty_of(m, {"w": torch.zeros(2)}, server, state).values()
    assert term.coef.tolist() == [0.25, -1.0]  # c - c_i
    # x = (1, 2) -> y = (0, 3) in K = 4 steps of lr 0.5: c_i+ = c_i - c + (x - y) / 2
    up = m.client_end(ClientEndContext("round", None, {"w": torch.tensor([0.0, 3.0])}, None, state, server, None,
                                       LocalTraining({"w": torch.tensor([1.0, 2.0])}, 4, 0.5)))
    assert state["c"]["w"].tolist() == [0.25, 0.5]
    assert up["dc"]["w"].tolist() == [0.0, 0.5]
    m.server_event(ServerEvent("round", server, 0, {}, {0: up, 1: {"dc": {"w": torch.tensor([4.0, 0.0])}}}))
    assert server["c"]["w"].tolist() == [1.5, -0.875]  # c + (dc_0 + dc_1) / N, N = 4


def test_feddyn_client_and_server_updates_by_hand():
    m = FedDyn(FedDynHyperparams(alpha=0.5), _info(num_clients=4, clients_per_round=2))
    server = {}
    m.server_event(ServerEvent("start", server, 0, {"w": torch.tensor([1.0])}))
    state = {}
    assert penalty_of(m, {"w": torch.tensor([1.0])}, server, state)["w"].linear is None
    m.client_end(ClientEndContext("round", None, {"w": torch.tensor([3.0])}, None, state, server, None,
                                  LocalTraining({"w": torch.tensor([1.0])}, 3, 0.1)))
    assert state["h"]["w"].tolist() == [-1.0]  # 0 - 0.5 * (3 - 1)
    q = penalty_of(m, {"w": torch.tensor([1.0])}, server, state)["w"]
    assert (q.weight, q.anchor.tolist(), q.linear.tolist()) == (0.5, [1.0], [1.0])  # loss - <h_k, w>
    # mean client model 3 (delta 2): h = 0 - 0.5 * (2/4) * 2 = -0.5; w = 1 + 2 - (-0.5) / 0.5 = 4
    new = m.server_update(ServerUpdate({"w": torch.tensor([1.0])}, {"w": torch.tensor([2.0])}, server, 1.0))
    assert server["h"]["w"].tolist() == [-0.5] and new["w"].tolist() == [4.0]


def test_feddyn_fused_terms_hold_the_linear_coefficient():
    m = FedDyn(FedDynHyperparams(alpha=0.5), _info())
    stacked = {"h": {"w": torch.tensor([[2.0], [-1.0]])}}
    terms = penalty_terms(m, {"w": torch.tensor([1.0])}, {}, stacked)
    a, b = terms["w"]
    # gradient alpha * w - (alpha * anchor + h): B = 0.5 + h
    assert a.flatten().tolist() == [0.5, 0.5] and b.flatten().tolist() == [2.5, -0.5]


@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_scaffold_and_feddyn_train_on_the_stacked_path(name, capsys):
    cfg = from_dict({"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 1, "batch_size": 8, "lr": 0.1,
                     "wandb": {"mode": "disabled"}, "method": {"name": name}})
    runner = Runner(cfg, make_stream("task", num_tasks=1))
    assert runner.engine_path.path == "stacked"
    assert "engine: stacked path" in capsys.readouterr().err


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.eye(2))

    def forward(self, x, task):
        return x @ self.w.T


def _derpp_step(m, carry, x, y, weight, key):
    params = {"w": torch.tensor([[2.0, 0.0], [0.0, 3.0]])}
    return m.carry_step(Step(params, {}, x, y, torch.zeros_like(y), weight, None, params, {}, {}, carry, 0.1, 0,
                             None, StepRandom(torch.tensor(key), 0), {}))


def test_derpp_reservoir_fills_in_order_then_replaces_by_hand():
    model = _Linear()
    info = RunInfo(1, "domain", 1, 1, 0, model, input_shape=(2,), batch_size=2, num_classes=2)
    m = DERpp(DERppHyperparams(mem_per_client=2), info)
    carry = carry_start_of(m, {"w": model.w.detach()}, {})
    x = torch.tensor([[1.0, 1.0], [2.0, 2.0], [5.0, 5.0]])
    y = torch.tensor([0, 1, 1])
    # the padding sample (weight 0) never enters: two real samples fill slots 0 and 1 in order
    out = _derpp_step(m, carry, x, y, torch.tensor([1.0, 1.0, 0.0]), 7)
    assert out["seen"] == 2 and out["x"].tolist() == [[1.0, 1.0], [2.0, 2.0]] and out["y"].tolist() == [0, 1]
    assert out["logits"].tolist() == [[2.0, 3.0], [4.0, 6.0]]  # the model's logits at the step's parameters
    # then the memory is full: sample n (from 0) replaces slot j ~ U{0..n} when j < 2 (algorithm R)
    new = torch.tensor([[7.0, 7.0], [8.0, 8.0]])
    later = _derpp_step(m, out, new, torch.tensor([0, 0]), torch.ones(2), 9)
    j = StepRandom(torch.tensor(9), 0).integers(torch.tensor([3, 4]), 2).tolist()
    expected = [[1.0, 1.0], [2.0, 2.0]]
    for n, slot in enumerate(j):
        if slot < 2:
            expected[slot] = new[n].tolist()
    assert later["seen"] == 4 and later["x"].tolist() == expected


def test_derpp_loss_is_alpha_mse_plus_beta_ce_by_hand():
    model = _Linear()
    info = RunInfo(1, "domain", 1, 1, 0, model, input_shape=(2,), batch_size=2, num_classes=2)
    m = DERpp(DERppHyperparams(mem_per_client=4, alpha=0.5, beta=2.0), info)
    from cfl.methods.base import Samples
    samples = Samples(torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 1]), torch.zeros(2, dtype=torch.long),
                      torch.ones(2), {"logits": torch.tensor([[0.0, 2.0], [0.0, 0.0]]), "mse": torch.tensor([1.0, 0])})
    loss = m.loss(LossContext("extra", {"w": torch.eye(2)}, torch.zeros(3, 2), torch.zeros(3, dtype=torch.long),
                              torch.ones(len(torch.zeros(3, 2))), {}, {}, samples)).extra
    # MSE of (1, 0) against (0, 2): (1 + 4) / 2 = 2.5; CE of logits (0, 0) at class 1: log 2
    assert loss.shape == (3,) and float(loss[0]) == pytest.approx(0.5 * 2.5 + 2.0 * float(torch.log(torch.tensor(2.0))))


class _Highest:
    """A step's random numbers that record each draw's bound and give its highest value, ``high - 1``."""

    def __init__(self) -> None:
        self.highs: list[list[int]] = []

    def integers(self, high, n):
        self.highs.append(torch.as_tensor(high).tolist())
        return torch.as_tensor(high) - 1


def test_derpp_reservoir_draws_sample_n_from_zero_to_n_inclusive():
    """Algorithm R: the ``n``-th sample (from 0) draws its slot in ``[0, n]``; with ``n`` = the memory's size the
    highest draw, ``n``, misses the memory (an off-by-one bound would put it in the last slot)."""
    model = _Linear()
    info = RunInfo(1, "domain", 1, 1, 0, model, input_shape=(2,), batch_size=2, num_classes=2)
    m = DERpp(DERppHyperparams(mem_per_client=2), info)
    carry = carry_start_of(m, {"w": model.w.detach()}, {})
    full = _derpp_step(m, carry, torch.tensor([[1.0, 1.0], [2.0, 2.0]]), torch.tensor([0, 1]), torch.ones(2), 7)
    params = {"w": torch.tensor([[2.0, 0.0], [0.0, 3.0]])}
    random = _Highest()
    new = torch.tensor([[7.0, 7.0], [8.0, 8.0]])
    later = m.carry_step(Step(params, {}, new, torch.tensor([0, 0]), torch.zeros(2, dtype=torch.long), torch.ones(2),
                              None, params, {}, {}, full, 0.1, 0, None, random, {}))
    assert random.highs == [[3, 4]]  # samples 2 and 3: slots in [0, 2] and [0, 3]
    assert later["x"].tolist() == [[1.0, 1.0], [2.0, 2.0]] and later["seen"] == 4  # draws 2 and 3: not kept
