"""Every registered method with a quadratic penalty: the loss the engine derives from it and the fused step's
``A * w - B`` agree (autograd gradient of the loss = ``A * w - B``), on each client's real state after a run."""

import pytest
import torch

from cfl.engine.local.hooks import penalty_loss, penalty_terms
from cfl.engine.local.stacking import stack_states
from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.server_state import broadcast_of
from cfl.methods import METHODS
from cfl.methods.declarations import gives
from cfl.validation import from_dict
from tests.conftest import make_stream

PENALTY_METHODS = sorted(name for name, cls in METHODS.items() if gives(cls, "penalty"))


def test_the_registry_has_quadratic_penalty_methods():
    assert {"fedprox", "ewc", "fedcurv"} <= set(PENALTY_METHODS)


@pytest.mark.parametrize("name", PENALTY_METHODS)
def test_derived_loss_gradient_equals_the_fused_terms(name):
    torch.manual_seed(0)
    cfg = from_dict({"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
                     "wandb": {"mode": "disabled"}, "method": {"name": name}})
    runner = Runner(cfg, make_stream("task", num_tasks=2))
    runner.run()  # two tasks: EWC has a Fisher, FedCurv its sums and per-client contributions
    method, state = runner.methods[0], runner.states[0]
    server = broadcast_of(method, "round", state.server)
    cids = list(range(cfg.num_clients))  # every client, with state or without
    states = [state.clients.get(c) for c in cids]
    stacked = stack_states(states, method.computes.ragged)
    terms = penalty_terms(method, runner.params, server, stacked)
    assert terms, "the penalty is empty after a run: nothing compared"
    gen = torch.Generator().manual_seed(1)
    for c, one in enumerate(states):
        w = {k: (v + torch.randn(v.shape, generator=gen)).requires_grad_() for k, v in runner.params.items()}
        loss = penalty_loss(method, w, runner.params, server, one)
        grads = dict(zip(w, torch.autograd.grad(loss, list(w.values()), allow_unused=True), strict=True))
        for k, (a, b) in terms.items():
            row = 0 if (a is None or a.shape[0] == 1) and b.shape[0] == 1 else c
            quadratic = 0.0 if a is None else a[min(row, a.shape[0] - 1)] * w[k].detach()  # None: a Linear term
            fused = quadratic - b[min(row, b.shape[0] - 1)]
            assert torch.allclose(fused, grads[k], atol=1e-5, rtol=1e-4), (name, c, k)
