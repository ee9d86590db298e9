"""EWC+FL: penalty value and gradient, Fisher of a softmax model by hand, separate vs online, engines agree."""

import pytest
import torch

from cfl.config.schema import ConfigError
from cfl.engine.local.hooks import penalty_loss
from cfl.heads import SharedHead
from cfl.methods import METHODS
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.ewc import EWC, EWCHyperparams
from cfl.methods.training_hooks import ClientEndContext
from cfl.metrics.results import method_stats
from cfl.models.mlp import MLP
from cfl.ops.fisher import diagonal_fisher
from cfl.records.client_states import MethodState
from cfl.records.comm import CommLedger
from cfl.validation import from_dict
from tests.conftest import changes_training, make_stream, penalty_of, run_both_paths
from tests.helpers import BatchStatNet


def _ewc(model, **kw):
    return EWC(EWCHyperparams(**kw), RunInfo(3, "domain", 4, 2, 0, model))


def _pen(ewc, w, state):
    return penalty_loss(ewc, w, w, {}, state)


def _end(ewc, model, params, data, state, generator):
    ewc.client_end(ClientEndContext("task_end", model, params, data, state, {}, generator))


def _softmax_model(weight, bias):
    model = SharedHead(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        model.weight.copy_(weight)
        model.bias.copy_(bias)
    return model, {k: v.detach().clone() for k, v in model.named_parameters()}


def test_penalty_is_zero_at_the_anchor_and_its_gradient_is_lambda_f_times_distance():
    gen = torch.Generator().manual_seed(0)
    shapes = {"a": (2, 3), "b": (3,)}
    fisher = {k: torch.rand(s, generator=gen) for k, s in shapes.items()}
    anchor = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    state = {"fisher": fisher, "anchor": anchor}
    ewc = _ewc(SharedHead(3, 2), lam=7.0)
    assert float(_pen(ewc, anchor, state)) == 0.0
    w = {k: torch.randn(s, generator=gen, requires_grad=True) for k, s in shapes.items()}
    pen = _pen(ewc, w, state)
    expected = 0.5 * 7.0 * sum(float((fisher[k] * (w[k] - anchor[k]).detach() ** 2).sum()) for k in shapes)
    assert float(pen.detach()) == pytest.approx(expected, rel=1e-6)
    grads = torch.autograd.grad(pen, list(w.values()))
    for k, g in zip(w, grads, strict=True):
        assert torch.allclose(g, 7.0 * fisher[k] * (w[k] - anchor[k]).detach(), atol=1e-6)


def test_no_penalty_before_the_first_task_ends():
    ewc = _ewc(SharedHead(3, 2))
    assert penalty_of(ewc, {"w": torch.ones(2)}, {}, {}) is None


def test_fisher_of_a_softmax_model_at_zero_weights_is_a_quarter_of_x_squared():
    # two classes, w = 0: p = (1/2, 1/2), d log p(y)/dW_c = (1[y=c] - 1/2) x, squared: x^2 / 4 for either label
    x = torch.tensor([[1.0, 2.0, -1.0], [3.0, 0.0, 1.0]])
    y = torch.tensor([0, 1])
    model, params = _softmax_model(torch.zeros(2, 3), torch.zeros(2))
    for kind in ("empirical", "true"):
        for per_sample in (False, True):
            f = diagonal_fisher(model, params, x, y, 0, kind, per_sample=per_sample)
            assert torch.allclose(f["weight"], (x**2).mean(0).expand(2, 3) / 4), kind
            assert torch.allclose(f["bias"], torch.full((2,), 0.25)), kind


def test_fisher_of_a_softmax_model_matches_the_closed_form_gradient():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, generator=gen), torch.tensor([0, 2, 1, 2, 0])
    model, params = _softmax_model(torch.randn(3, 3, generator=gen), torch.randn(3, generator=gen))
    p = torch.softmax(x @ params["weight"].T + params["bias"], 1)
    # d log p(c|x) / d logits = e_c - p ; per-sample gradient for W is (e_c - p) x^T
    emp_w = torch.zeros(3, 3)
    emp_b = torch.zeros(3)
    true_w = torch.zeros(3, 3)
    true_b = torch.zeros(3)
    for n in range(5):
        for c in range(3):
            delta = torch.nn.functional.one_hot(torch.tensor(c), 3).float() - p[n]
            if c == y[n]:
                emp_w += torch.outer(delta, x[n]) ** 2 / 5
                emp_b += delta**2 / 5
            true_w += p[n, c] * torch.outer(delta, x[n]) ** 2 / 5
            true_b += p[n, c] * delta**2 / 5
    for per_sample in (False, True):
        emp = diagonal_fisher(model, params, x, y, 0, "empirical", per_sample=per_sample)
        true = diagonal_fisher(model, params, x, y, 0, "true", per_sample=per_sample)
        assert torch.allclose(emp["weight"], emp_w, atol=1e-6) and torch.allclose(emp["bias"], emp_b, atol=1e-6)
        assert torch.allclose(true["weight"], true_w, atol=1e-6) and torch.allclose(true["bias"], true_b, atol=1e-6)


@pytest.mark.parametrize("multi_head", [False, True])
def test_linear_shortcut_equals_per_sample_gradients_on_an_mlp(multi_head):
    torch.manual_seed(3)
    model = MLP(5, [6, 4], 3, num_tasks=2, multi_head=multi_head, dropouts=[0.5, 0.0])
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(7, 5), torch.tensor([0, 1, 2, 0, 1, 2, 1])
    for kind, allowed in (("empirical", None), ("true", None), ("true", torch.tensor([True, False, True]))):
        yy = y.clamp(max=1) * 2 if allowed is not None else y
        fast = diagonal_fisher(model, params, x, yy, 1, kind, allowed)
        slow = diagonal_fisher(model, params, x, yy, 1, kind, allowed, per_sample=True)
        for k in params:
            assert torch.allclose(fast[k], slow[k], atol=1e-6, rtol=1e-4), (kind, k)
    if multi_head:
        assert float(fast["head.weight"][0].abs().sum()) == 0.0  # only the task's own head has information


def test_fisher_runs_in_eval_mode_so_dropout_does_not_make_it_random():
    torch.manual_seed(0)
    model = MLP(4, [8, 8], 3, dropouts=[0.5, 0.5])
    params = dict(model.named_parameters())
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    a, b = diagonal_fisher(model, params, x, y, 0), diagonal_fisher(model, params, x, y, 0)
    assert all(torch.equal(a[k], b[k]) for k in a) and model.training


def _two_tasks(mode, gamma=1.0):
    gen = torch.Generator().manual_seed(2)
    model, _ = _softmax_model(torch.zeros(3, 4), torch.zeros(3))
    ewc = _ewc(model, lam=3.0, mode=mode, gamma=gamma)
    data = [ClientData(torch.randn(6, 4, generator=gen), torch.tensor([0, 1, 2, 0, 1, 2]), t) for t in range(2)]
    anchors = [{"weight": torch.randn(3, 4, generator=gen), "bias": torch.randn(3, generator=gen)} for _ in range(2)]
    fishers = [diagonal_fisher(model, anchors[t], data[t].x, data[t].y, t) for t in range(2)]
    state: dict = {}
    for t in range(2):
        _end(ewc, model, anchors[t], data[t], state, torch.Generator())
    w = {"weight": torch.randn(3, 4, generator=gen, requires_grad=True),
         "bias": torch.randn(3, generator=gen, requires_grad=True)}
    return ewc, state, w, anchors, fishers


def test_separate_mode_equals_one_term_per_task():
    ewc, state, w, anchors, fishers = _two_tasks("separate")
    pen = _pen(ewc, w, state)

    def expected(p):
        return sum(1.5 * (fishers[t][k] * (p[k] - anchors[t][k]) ** 2).sum() for t in range(2) for k in p)

    w0 = {k: v.detach() * 0.5 for k, v in w.items()}  # equal up to the constant the merged form drops
    assert float(pen.detach() - _pen(ewc, w0, state)) == pytest.approx(float((expected(w) - expected(w0)).detach()),
                                                                       rel=1e-5)
    grads = dict(zip(w, torch.autograd.grad(pen, list(w.values())), strict=True))
    for k in w:
        want = sum(3.0 * fishers[t][k] * (w[k] - anchors[t][k]) for t in range(2)).detach()
        assert torch.allclose(grads[k], want, atol=1e-5), k


def test_online_mode_decays_the_old_fisher_and_anchors_the_latest_model():
    ewc, state, w, anchors, fishers = _two_tasks("online", gamma=0.5)
    for k in w:
        assert torch.allclose(state["fisher"][k], 0.5 * fishers[0][k] + fishers[1][k])
        assert torch.equal(state["anchor"][k], anchors[1][k])
    pen = _pen(ewc, w, state)
    expected = sum(1.5 * ((0.5 * fishers[0][k] + fishers[1][k]) * (w[k] - anchors[1][k]) ** 2).sum() for k in w)
    assert float(pen.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)


def test_state_size_is_two_models_per_client_in_method_stats():
    ewc, state, w, anchors, _ = _two_tasks("separate")
    ms = MethodState()
    ms.clients.put(0, state)
    ms.clients.put(1, {})
    stats = method_stats(CommLedger(), ewc, ms)
    model_bytes = sum(v.numel() * 4 for v in anchors[0].values())
    assert stats["client_state_bytes_max"] == 2 * model_bytes and stats["clients_with_state"] == 1


def test_bad_mode_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="method.mode"):
        from_dict({"method": {"name": "ewc", "mode": "both"}})


def _cfg(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "stream": {"name": "permuted-digits", "num_tasks": 3}, "wandb": {"mode": "disabled"}}
    base.update(kw)
    return from_dict(base)


CASES = [
    ("task", {"method": {"name": "ewc", "lam": 50.0}}),
    ("domain", {"method": {"name": "ewc", "lam": 50.0, "mode": "online", "gamma": 0.9, "fisher": "true"}}),
    ("task", {"method": {"name": "ewc", "lam": 50.0}, "plugins": [{"name": "fedprox", "mu": 0.1}]}),
]


@pytest.mark.parametrize(("scenario", "case"), CASES, ids=["separate", "online-true", "with-fedprox"])
def test_batched_equals_sequential(case, scenario):
    stream = make_stream(scenario, num_tasks=3)
    runs = run_both_paths(_cfg, stream, **case)
    assert len(runs[0].states[0].clients) == 5


def test_penalty_changes_training_after_the_first_task():
    assert changes_training(_cfg, {"name": "ewc", "lam": 1000.0})


def _batch_mode_fisher_by_hand(model, x, y, batch, kind):
    """Autograd, one sample at a time, through the forward of its whole batch (as training sees it)."""
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    for start in range(0, len(x), batch):
        logp = torch.log_softmax(model(x[start : start + batch], None), -1)
        for i, label in enumerate(y[start : start + batch].tolist()):
            probs = logp[i].detach().exp().tolist()
            classes = [(label, 1.0)] if kind == "empirical" else list(enumerate(probs))
            for c, weight in classes:
                grads = torch.autograd.grad(logp[i, c], params, retain_graph=True)
                total = [t + weight * g**2 for t, g in zip(total, grads, strict=True)]
    return {name: t / len(x) for (name, _), t in zip(model.named_parameters(), total, strict=True)}


@pytest.mark.parametrize("kind", ["empirical", "true"])
def test_fisher_of_a_batch_statistics_model_is_taken_through_its_training_batches(kind):
    torch.manual_seed(0)
    model = BatchStatNet()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(7, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    expected = _batch_mode_fisher_by_hand(model, x, y, 3, kind)  # batches of 3, 3 and 1 samples
    ewc = EWC(EWCHyperparams(fisher=kind), RunInfo(3, "domain", 4, 2, 0, model, batch_size=3))
    state = {}
    _end(ewc, model, params, ClientData(x, y, 0), state, torch.Generator().manual_seed(0))
    for k, v in expected.items():
        assert torch.allclose(state["fisher"][k], v, rtol=1e-4, atol=1e-7), k
    fedcurv = METHODS["fedcurv"](METHODS["fedcurv"].Hyperparams(fisher=kind), RunInfo(3, "domain", 4, 2, 0, model,
                                                                                       batch_size=3))
    payload = fedcurv.client_end(ClientEndContext("round", model, params, ClientData(x, y, 0), {}, {},
                                                  torch.Generator()))
    assert all(torch.allclose(payload["I"][k], v, rtol=1e-4, atol=1e-7) for k, v in expected.items())
    assert not torch.allclose(expected["conv.weight"], _batch_mode_fisher_by_hand(model, x, y, 1, kind)["conv.weight"])
    with pytest.raises(ValueError, match="batch_size"):
        diagonal_fisher(model, params, x, y, 0, kind)
