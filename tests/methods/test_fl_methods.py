"""FedCurv, FedAdam/FedYogi (+GMA), TCE and the TCE paper's client-forgetting metric on tiny tensors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from cfl.config.keys import ConfigError
from cfl.engine.local.hooks import penalty_loss, penalty_terms, quadratic_loss
from cfl.engine.local.stacking import stack_states
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import RunInfo
from cfl.methods.server_hooks import ServerEvent, ServerUpdate
from cfl.metrics.client_forgetting import forgetting_matrix, label_distribution, mean_over_others
from cfl.metrics.results import build_results
from cfl.ops.aggregate import aggregate
from cfl.ops.losses import masked_cross_entropy
from cfl.validation import from_dict
from tests.conftest import make_stream, penalty_of, run_both_paths
from tests.helpers import gradient_masked_mean


def _cfg(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "wandb": {"mode": "disabled"}}
    base.update(kw)
    return from_dict(base)


def _method(name, **params):
    run = RunInfo(1, "domain", 4, 4, 0, torch.nn.Linear(1, 1))
    return METHODS[name](METHODS[name].Hyperparams(**params), run)


# ---------------- FedProx ----------------

def test_fedprox_penalty_and_its_gradient_match_hand_values():
    prox = _method("fedprox", mu=0.5)
    w = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[3.0]])}
    g = {"a": torch.tensor([0.0, 4.0]), "b": torch.tensor([[1.0]])}
    # mu/2 * ||w - g||^2 = 0.25 * (1 + 4 + 4) = 2.25; gradient mu * (w - g) = [0.5, -1], [[1]]
    assert float(quadratic_loss(w, penalty_of(prox, g, {}, {}))) == pytest.approx(2.25)
    grads = {k: a[0] * w[k] - b[0] for k, (a, b) in penalty_terms(prox, g, {}, {}).items()}
    assert torch.allclose(grads["a"], torch.tensor([0.5, -1.0])) and torch.allclose(grads["b"], torch.tensor([[1.0]]))


# ---------------- FedCurv ----------------

def _fedcurv_round(method, gen):
    """Three clients (0, 1, 2) contribute in one round: returns their (I, w) and the server state."""
    shapes = {"w": (2, 3), "b": (3,)}
    clients = {c: ({k: torch.rand(s, generator=gen) for k, s in shapes.items()},
                   {k: torch.randn(s, generator=gen) for k, s in shapes.items()}) for c in range(3)}
    server, states = {}, {}
    for c, (fisher, w) in clients.items():
        states[c] = {"I": fisher, "Iw": {k: fisher[k] * w[k] for k in w}, "round": torch.tensor(0, dtype=torch.int32)}
    method.server_event(ServerEvent("round", server, 0, {}, {c: {"I": fisher, "Iw": {k: fisher[k] * w[k] for k in w}}
                                                             for c, (fisher, w) in clients.items()}))
    return clients, states, server


def _broadcast(method, server):
    return {k: server[k] for k in method.sends.broadcast["round"] if k in server}


def _brute(params, clients, skip, lam):
    return lam * sum((clients[j][0][k] * (params[k] - clients[j][1][k]) ** 2).sum()
                     for j in clients if j != skip for k in params)


@pytest.mark.parametrize("who", ["contributor", "newcomer", "stale"])
def test_fedcurv_penalty_equals_brute_force_sum_over_other_clients(who):
    gen = torch.Generator().manual_seed(0)
    method = _method("fedcurv", lam=0.7)
    clients, states, server = _fedcurv_round(method, gen)
    broadcast = _broadcast(method, server)
    if who == "contributor":  # client 1 took part in the previous round: its own term is left out
        state, skip = states[1], 1
    elif who == "newcomer":  # never took part: every previous client counts
        state, skip = {}, None
    else:  # took part two rounds ago: its stored Fisher is not inside u, v and must not be subtracted
        state, skip = {**states[1], "round": torch.tensor(-5, dtype=torch.int32)}, None
    w1 = {"w": torch.randn(2, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    w2 = {k: torch.randn(v.shape, generator=gen) for k, v in w1.items()}
    pen = lambda p: penalty_loss(method, p, p, broadcast, state)  # noqa: E731
    # equal up to a constant: same differences, same gradients
    assert torch.allclose(pen(w1) - pen(w2), _brute(w1, clients, skip, 0.7) - _brute(w2, clients, skip, 0.7),
                          atol=1e-5)
    g, g_brute = grad(pen)(w1), grad(lambda p: _brute(p, clients, skip, 0.7))(w1)
    for k in w1:
        assert torch.allclose(g[k], g_brute[k], atol=1e-5), k


def test_fedcurv_penalty_vmapped_over_stacked_states_matches_each_client():
    gen = torch.Generator().manual_seed(1)
    method = _method("fedcurv", lam=1.0)
    clients, states, server = _fedcurv_round(method, gen)
    broadcast = _broadcast(method, server)
    per_client = [states[0], {}, states[2]]  # a newcomer in the middle gets zeros (engine's padding)
    stacked = stack_states(per_client, method.computes.ragged)
    params = {"w": torch.randn(3, 2, 3, generator=gen), "b": torch.randn(3, 3, generator=gen)}
    batched = vmap(lambda p, st: penalty_loss(method, p, p, broadcast, st))(params, stacked)
    for i, st in enumerate(per_client):
        one = {k: v[i] for k, v in params.items()}
        assert torch.allclose(batched[i], penalty_loss(method, one, one, broadcast, st), atol=1e-5)


def test_fedcurv_has_no_penalty_before_any_round():
    method = _method("fedcurv")
    assert _broadcast(method, {}) == {}
    assert penalty_of(method, {"w": torch.ones(2)}, {}, {}) is None


def test_fedcurv_run_traffic_is_three_models_each_way_and_server_sums_last_round():
    stream = make_stream("domain", num_tasks=1)
    rounds, clients = 3, 3
    runner = Runner(_cfg(rounds_per_task=rounds, method={"name": "fedcurv", "lam": 0.5}), stream)
    runner.run()
    model = runner.model_bytes
    assert runner.comm.upload_bytes == rounds * clients * 3 * model
    # round 1 has no u, v yet; later rounds send w, u, v and the 4-byte round index
    assert runner.comm.download_bytes == clients * model + (rounds - 1) * clients * (3 * model + 4)
    server, states = runner.states[0].server, runner.states[0].clients
    last = [c for c in states.ids() if int(states.get(c)["round"]) == rounds - 1]
    assert len(last) == clients and server["round"] == rounds
    for k in runner.params:
        assert torch.allclose(server["u"][k], sum(states.get(c)["I"][k] for c in last))
        assert torch.allclose(server["v"][k], sum(states.get(c)["Iw"][k] for c in last))
    assert states.get(last[0])["I"]["body.1.weight"].sum() > 0


CASES = [
    {"method": {"name": "fedcurv", "lam": 0.5}, "rounds_per_task": 3},
    {"method": {"name": "fedadam", "server_lr": 0.05}},
    {"method": {"name": "fedyogi", "server_lr": 0.05}, "aggregator": {"name": "gma", "tau": 0.5}},
]


@pytest.mark.parametrize("case", CASES, ids=[c["method"]["name"] for c in CASES])
@pytest.mark.parametrize("scenario", ["task", "class"])
def test_batched_equals_sequential(case, scenario):
    stream = make_stream(scenario)
    run_both_paths(_cfg, stream, **case)


# ---------------- FedAdam / FedYogi (+ GMA) ----------------

def _adam_step(m, v, d, lr, b1=0.9, b2=0.99, tau=1e-3, yogi=False):
    m = b1 * m + (1 - b1) * d
    v = v - (1 - b2) * d * d * math.copysign(1.0, v - d * d) if yogi else b2 * v + (1 - b2) * d * d
    return m, v, lr * m / (math.sqrt(v) + tau)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi"])
def test_adaptive_server_two_steps_match_hand_computation(name):
    method = _method(name, server_lr=0.1)
    server = {}
    w = {"x": torch.tensor([1.0, 1.0], dtype=torch.float64)}
    d1 = {"x": torch.tensor([0.5, -0.2], dtype=torch.float64)}
    d2 = {"x": torch.tensor([0.01, -0.2], dtype=torch.float64)}  # coord 0: v > d^2, so Yogi's v shrinks
    w1 = method.server_update(ServerUpdate(w, d1, server, server_lr=123.0))  # the method's own server_lr wins
    w2 = method.server_update(ServerUpdate(w1, d2, server, server_lr=123.0))
    for j in range(2):
        m, v, x = 0.0, 1e-6, 1.0
        for d, got in ((d1, w1), (d2, w2)):
            m, v, step = _adam_step(m, v, float(d["x"][j]), 0.1, yogi=name == "fedyogi")
            x += step
            assert float(got["x"][j]) == pytest.approx(x, rel=1e-12), (j, got)
        assert float(server["m"]["x"][j]) == pytest.approx(m) and float(server["v"]["x"][j]) == pytest.approx(v)
    # the first step on coord 0 by hand: m = 0.05, v = 0.99e-6 + 0.0025 (Adam) or 1e-6 + 0.0025 (Yogi,
    # since v < D^2), w = 1 + 0.1 * 0.05 / (sqrt(v) + 1e-3)
    v1 = (0.99e-6 if name == "fedadam" else 1e-6) + 0.0025
    assert float(w1["x"][0]) == pytest.approx(1 + 0.1 * 0.05 / (math.sqrt(v1) + 1e-3), rel=1e-12)


def test_adam_and_yogi_second_moments_differ_as_defined():
    adam, yogi = _method("fedadam"), _method("fedyogi")
    v, d2 = torch.tensor([0.5, 0.1]), torch.tensor([0.1, 0.5])
    assert torch.allclose(adam.second_moment(v, d2), torch.tensor([0.99 * 0.5 + 0.001, 0.99 * 0.1 + 0.005]))
    assert torch.allclose(yogi.second_moment(v, d2), torch.tensor([0.5 - 0.001, 0.1 + 0.005]))


def test_aggregate_returns_mean_and_gma_mask():
    deltas = {"w": torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, -1.0], [1.0, -4.0, 0.0]])}
    weights = torch.ones(3)
    mean, mask = aggregate("mean", deltas, weights, 0.4)
    assert mask is None and torch.allclose(mean["w"], deltas["w"].mean(0))
    mean, mask = aggregate("gma", deltas, weights, 0.4)
    assert torch.allclose(mask["w"], torch.tensor([1.0, 1 / 3, 0.0]))
    assert torch.allclose(mask["w"] * mean["w"], gradient_masked_mean(deltas, weights, 0.4)["w"])


def test_fedadam_with_gma_masks_the_final_step_not_the_moments():
    stream = make_stream("domain", num_tasks=1)
    runner = Runner(_cfg(method={"name": "fedadam", "server_lr": 0.1}, aggregator={"name": "gma"}), stream)
    start = {k: v.clone() for k, v in runner.params.items()}
    delta = {k: torch.full_like(v, 0.5) for k, v in start.items()}
    mask = {k: torch.full_like(v, 0.25) for k, v in start.items()}
    new = runner.server.apply(delta, mask, 0)
    # Adam's first step on a constant 0.5: m = 0.05, v = 0.99e-6 + 0.0025; then masked by 0.25
    step = 0.1 * 0.05 / (math.sqrt(0.99e-6 + 0.0025) + 1e-3)
    for k in start:
        assert torch.allclose(new[k] - start[k], torch.full_like(start[k], 0.25 * step), atol=1e-6)
        assert torch.allclose(runner.states[0].server["m"][k], torch.full_like(start[k], 0.05))  # unmasked D


def test_fedavg_with_gma_mask_is_the_masked_mean_and_tau_zero_is_averaging():
    stream = make_stream("domain", num_tasks=1)
    runner = Runner(_cfg(server_lr=0.5), stream)
    delta = {k: torch.ones_like(v) for k, v in runner.params.items()}
    mask = {k: torch.full_like(v, 0.3) for k, v in runner.params.items()}
    new = runner.server.apply(delta, mask, 0)
    for k, w in runner.params.items():
        assert torch.allclose(new[k], w + 0.3 * 0.5)
    gma0 = Runner(_cfg(aggregator={"name": "gma", "tau": 0.0}), stream)
    mean = Runner(_cfg(), stream)
    gma0.run()
    mean.run()
    for k in mean.params:
        assert torch.equal(gma0.params[k], mean.params[k]), k


# ---------------- TCE ----------------

def test_tce_is_cross_entropy_over_the_client_label_subset():
    gen = torch.Generator().manual_seed(0)
    logits, y = torch.randn(6, 5, generator=gen), torch.tensor([0, 2, 4, 2, 0, 4])
    allowed = torch.tensor([True, False, True, False, True])
    subset = torch.tensor([0, 2, 4])
    remap = torch.tensor([0, -1, 1, -1, 2])
    expected = F.cross_entropy(logits[:, subset], remap[y], reduction="none")
    assert torch.allclose(masked_cross_entropy(logits, y, allowed), expected)
    everything = torch.ones(5, dtype=torch.bool)
    assert torch.allclose(masked_cross_entropy(logits, y, everything), F.cross_entropy(logits, y, reduction="none"))
    assert torch.allclose(masked_cross_entropy(logits, y, None), F.cross_entropy(logits, y, reduction="none"))


def test_tce_label_set_is_the_clients_labels_of_the_task():
    stream = make_stream("domain", num_tasks=1, classes=3)
    runner = Runner(_cfg(loss="tce", partition={"name": "shards", "shards_per_client": 1}), stream)
    for c, idx in enumerate(runner.schedule.client_indices(0)):
        present = set(stream.tasks[0].train_y[idx].tolist())
        assert runner.schedule.allowed(c, 0, 0, idx).nonzero().flatten().tolist() == sorted(present)
    assert Runner(_cfg(), stream).schedule.allowed(0, 0, 0, runner.schedule.client_indices(0)[0]) is None


# ---------------- local client forgetting (TCE paper) ----------------

def test_client_forgetting_on_a_hand_made_case():
    # 3 classes; client 0 holds classes {0, 1} half/half, client 1 only class 2, client 2 classes {1, 2} 1:3
    dist = torch.stack([label_distribution(torch.tensor(y), 3) for y in ([0, 1], [2, 2], [1, 2, 2, 2])])
    global_acc = torch.tensor([80.0, 60.0, 40.0], dtype=torch.float64)
    client_acc = torch.tensor([[100.0, 90.0, 0.0],   # client 0's model: forgot class 2
                               [0.0, 10.0, 100.0],   # client 1's model: forgot classes 0, 1
                               [20.0, 80.0, 60.0]], dtype=torch.float64)
    fm = forgetting_matrix(global_acc, client_acc, dist)
    # Acc_k(global): k0 = 70, k1 = 40, k2 = 0.25*60 + 0.75*40 = 45
    expected = torch.tensor([[95 - 70, 5 - 70, 50 - 70],
                             [0 - 40, 100 - 40, 60 - 40],
                             [0.25 * 90 - 45, 0.25 * 10 + 75 - 45, 0.25 * 80 + 0.75 * 60 - 45]], dtype=torch.float64)
    assert torch.allclose(fm, expected)
    assert torch.allclose(mean_over_others(fm), torch.tensor([(-65 - 20) / 2, (-40 + 20) / 2, (-22.5 + 32.5) / 2],
                                                             dtype=torch.float64))


def test_client_forgetting_skips_classes_without_test_samples():
    dist = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    acc = torch.tensor([50.0, float("nan"), 10.0], dtype=torch.float64)
    assert torch.allclose(forgetting_matrix(acc, torch.tensor([[70.0, float("nan"), 0.0]], dtype=torch.float64),
                                            dist), torch.tensor([[20.0]], dtype=torch.float64))


def test_client_forgetting_is_recorded_per_round_and_summarised():
    stream = make_stream("domain", num_tasks=2)
    runner = Runner(_cfg(client_forgetting_clients=2, eval_every=1, clients_per_round=3), stream)
    runner.run()
    entries = runner.progress.client_forgetting
    assert [e["round"] for e in entries] == [1, 2, 3, 4] and [e["task"] for e in entries] == [0, 0, 1, 1]
    for e in entries:
        fm = torch.tensor(e["F_ki"])
        assert fm.shape == (2, 2) and len(e["clients"]) == 2
        assert e["F_k"] == pytest.approx([float(fm[0, 1]), float(fm[1, 0])])
        assert e["mean"] == pytest.approx(sum(e["F_k"]) / 2)
    attached = [x for ev in runner.progress.evaluations for x in ev.get("client_forgetting", [])]
    assert attached == entries  # each entry travels with exactly one metrics.jsonl record
    summary = build_results(runner.snapshot(), 0.0)["client_forgetting"]
    assert summary["rounds_measured"] == 4 and summary["clients_per_round"] == 2
    assert summary["mean_F"] == pytest.approx(sum(e["mean"] for e in entries) / 4)
    assert "client_forgetting" not in build_results(Runner(_cfg(), stream).snapshot(), 0.0)


def test_client_forgetting_of_one_client_is_refused():
    with pytest.raises(ConfigError, match="client_forgetting_clients"):
        _cfg(client_forgetting_clients=1)
