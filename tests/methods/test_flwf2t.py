"""FLwF-2T: the two teachers are taken when the method says (own: the client's last local model of a finished
task; server: the task's final global model), weighted as the paper's loss over alpha, and a mix of clients with
and without an own teacher trains alike batched and sequential."""

import pytest
import torch
from torch.func import functional_call

from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import ClientData
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.ops.distill import soft_kl
from tests.conftest import make_stream, run_both_paths, tiny_config


def _cfg(**kw):
    base = {"num_clients": 6, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": {"name": "flwf2t"}}
    base.update(kw)
    return tiny_config(**base)


def _shifted(params, by):
    return {k: v + by for k, v in params.items()}


def _same(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_own_teacher_is_the_last_local_model_and_server_teacher_the_final_global_model():
    runner = Runner(_cfg(), make_stream("task", num_tasks=3))
    m, model, stream = runner.methods[0], runner.model, runner.stream
    data = [ClientData(t.train_x, t.train_y, i) for i, t in enumerate(stream.tasks)]
    state, w = {}, runner.params
    m.client_end(ClientEndContext("round", model, _shifted(w, 1.0), data[0], state, {}, None))
    m.client_end(ClientEndContext("round", model, _shifted(w, 2.0), data[0], state, {},
                                  None))  # its last round of task 0
    m.client_end(ClientEndContext("task_end", model, _shifted(w, 5.0), data[0], state, {}, None))
    assert _same(state["own"], _shifted(w, 2.0)) and _same(state["global"], _shifted(w, 5.0))
    assert state["own_heads"].tolist() == state["global_heads"].tolist() == [1.0, 0.0, 0.0]
    assert "latest" not in state  # promoted, not kept twice
    # not sampled in task 1: it keeps its own teacher of task 0; the server teacher moves on
    m.client_end(ClientEndContext("task_end", model, _shifted(w, 7.0), data[1], state, {}, None))
    assert _same(state["own"], _shifted(w, 2.0)) and state["own_heads"].tolist() == [1.0, 0.0, 0.0]
    assert _same(state["global"], _shifted(w, 7.0)) and state["global_heads"].tolist() == [1.0, 1.0, 0.0]
    # a client that never trained has the server teacher only
    fresh = {}
    m.client_end(ClientEndContext("task_end", model, w, data[0], fresh, {}, None))
    assert set(fresh) == {"global", "global_heads"}


@pytest.mark.parametrize(("alpha", "beta", "own_coef", "server_coef"),
                         [(0.4, 0.3, 0.75, 0.75),  # 0.3/0.4 and (1 - 0.7)/0.4
                          (0.5, 0.5, 1.0, 0.0),
                          (1.0, 0.0, 0.0, 0.0)])  # plain cross-entropy
def test_the_two_terms_are_weighted_as_the_paper_over_alpha(alpha, beta, own_coef, server_coef):
    runner = Runner(_cfg(method={"name": "flwf2t", "alpha": alpha, "beta": beta, "temperature": 3.0}),
                    make_stream("domain", num_tasks=2))
    m, model, w = runner.methods[0], runner.model, runner.params
    task0 = runner.stream.tasks[0]
    own, server = _shifted(w, 0.05), {k: v * 1.1 for k, v in w.items()}
    state = {}
    m.client_end(ClientEndContext("round", model, own, ClientData(task0.train_x, task0.train_y, 0), state, {}, None))
    m.client_end(ClientEndContext("task_end", model, server, ClientData(task0.train_x, task0.train_y, 0), state, {},
                                  None))
    x, t = runner.stream.tasks[1].train_x[:5], torch.ones(5, dtype=torch.long)

    def logits(p):
        return functional_call(model, p, (x, t))

    by_hand = own_coef * soft_kl(logits(own), logits(w), 3.0) + server_coef * soft_kl(logits(server), logits(w), 3.0)
    got = m.loss(LossContext("extra", w, x, t, torch.ones(len(x)), {}, state)).extra
    assert torch.allclose(got, by_hand, atol=1e-6)
    assert float(got.min()) > 0 or own_coef == server_coef == 0.0


def test_no_teacher_in_the_first_task():
    runner = Runner(_cfg(), make_stream("task", num_tasks=2))
    x = runner.stream.tasks[0].train_x[:4]
    assert torch.equal(runner.methods[0].loss(LossContext("extra", runner.params, x, torch.zeros(4, dtype=torch.long),
                                                          torch.ones(len(x)), {}, {})).extra,
                       torch.zeros(4))


def test_alpha_plus_beta_above_one_is_refused():
    cls = METHODS["flwf2t"]
    with pytest.raises(ConfigError, match="exceeds 1"):
        cls.check(cls.Hyperparams(alpha=0.8, beta=0.3), None)
    with pytest.raises(ConfigError, match="exceeds 1"):
        Runner(_cfg(method={"name": "flwf2t", "alpha": 0.6, "beta": 0.6}), make_stream())


def test_a_run_keeps_own_teachers_for_the_trained_clients_only_and_batched_equals_sequential():
    stream = make_stream("task", num_tasks=3)
    batched, _ = run_both_paths(lambda **kw: _cfg(num_clients=8, clients_per_round=2, **kw), stream)
    clients = batched.states[0].clients
    states = [clients.get(c) for c in sorted(clients.ids())]
    assert len(states) == 8 and all("global" in s for s in states)
    with_own = [s for s in states if "own" in s]
    assert 0 < len(with_own) < 8  # the batches mixed clients with and without an own teacher
    assert all(not _same(s["own"], s["global"]) for s in with_own)
