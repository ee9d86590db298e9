"""``optimizer.state: kept``: each client's optimiser state (momentum buffer, Adam moments, step count) carried from
its last round: one client over two rounds equals one torch.optim optimiser run over all its steps; the batched
paths equal the sequential one with ragged clients; a resumed run equals an uninterrupted one; refusals."""

import dataclasses

import pytest
import torch
from torch.func import functional_call

from cfl.config.schema import ConfigError
from cfl.engine.local.jobs import client_schedule
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint
from cfl.validation import from_dict
from tests.conftest import make_stream, run_both_paths

OPTIMIZERS = {"adam": {"optimizer": {"name": "adam", "state": "kept"}},
              "momentum": {"optimizer": {"name": "sgd", "state": "kept"}, "momentum": 0.9}}


def _cfg(optimizer: str, **kw):
    base = {"num_clients": 1, "clients_per_round": 1, "rounds_per_task": 2, "batch_size": 16, "lr": 0.05,
            "wandb": {"mode": "disabled"}, **OPTIMIZERS[optimizer]}
    return from_dict({**base, **kw})


@pytest.mark.parametrize("execution", ["batched", "sequential"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_one_client_over_two_rounds_is_one_torch_optimiser_over_all_its_steps(optimizer, execution):
    """With one client and FedAvg the global model after a round is the client's: kept state makes the two rounds
    one optimiser run (torch.optim.Adam / SGD with momentum over the same batches); fresh state differs."""
    stream = make_stream("task", num_tasks=1)
    runner = Runner(_cfg(optimizer, client_execution=execution), stream)
    start = {k: v.detach().clone().requires_grad_() for k, v in runner.params.items()}
    batches = [b for rnd in range(2) for b in client_schedule(runner.schedule.round_jobs(0, rnd)[0], runner.hyper)]
    runner.run()
    opt = (torch.optim.Adam(list(start.values()), lr=0.05) if optimizer == "adam"
           else torch.optim.SGD(list(start.values()), lr=0.05, momentum=0.9))
    x, y = stream.tasks[0].train_x, stream.tasks[0].train_y
    for b in batches:
        opt.zero_grad()
        logits = functional_call(runner.model, start, (x[b], torch.zeros_like(y[b])))
        torch.nn.functional.cross_entropy(logits, y[b]).backward()
        opt.step()
    for k, v in start.items():
        assert torch.allclose(runner.params[k], v.detach(), atol=1e-6, rtol=1e-5), k
    fresh = Runner(dataclasses.replace(runner.cfg, optimizer=dataclasses.replace(runner.cfg.optimizer,
                                                                                 state="fresh")), stream)
    fresh.run()
    assert any(not torch.allclose(fresh.params[k], v.detach(), atol=1e-6) for k, v in start.items())


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_batched_equals_sequential_with_ragged_clients(optimizer):
    stream = make_stream("task", num_tasks=2)
    batched, _ = run_both_paths(lambda **kw: _cfg(optimizer, num_clients=4, clients_per_round=3, rounds_per_task=3,
                                                  batch_size=7, **kw), stream,
                                partition={"name": "quantity", "beta": 0.5})
    states = batched.optimizer_states
    assert len(states) == 4 and all(int(states.get(c)["t"]) > 0 for c in states.ids())


def test_a_resumed_run_equals_an_uninterrupted_one():
    stream = make_stream("task", num_tasks=2)
    cfg = _cfg("adam", num_clients=4, clients_per_round=2, rounds_per_task=3)
    whole = Runner(cfg, stream)
    whole.run()
    first = Runner(cfg, stream)
    first.should_stop = lambda: first.progress.global_round == 2
    first.run()
    payload = checkpoint.capture(first.snapshot(), None)
    assert len(payload["optimizer_states"]) > 0
    second = Runner(cfg, stream)
    second.resume(checkpoint.restore(second.snapshot(), payload))
    second.run()
    for k in whole.params:
        assert torch.equal(whole.params[k], second.params[k]), k


@pytest.mark.parametrize(("keys", "words"), [
    ({"optimizer": {"name": "sgd", "state": "kept"}}, "plain SGD (momentum 0): it has no state to keep"),
])
def test_refusals(keys, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        from_dict({"wandb": {"mode": "disabled"}, **keys})
