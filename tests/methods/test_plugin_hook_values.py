"""What the plugin interface hands a hook: ``Samples.extra``, ``step.random``, a carry read by ``samples``' step part,
``server_event("start")``, ``client_end``'s ``training``, ``Linear`` and ``Quadratic.linear`` penalties,
``num_classes`` in the sizing; with hand-computed values."""

import pytest
import torch
from torch.func import vmap

from cfl.engine.local.hooks import quadratic_loss
from cfl.engine.local.stacking import pad_samples
from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.state_stores import sizing_of
from cfl.methods import METHODS
from cfl.methods.base import ClientStart
from cfl.ops.counter_random import StepRandom
from cfl.plugin import Computes, Draw, Linear, Method, Quadratic, Samples, Sends, register
from cfl.validation import from_dict
from tests.conftest import make_stream


@pytest.fixture(autouse=True)
def _registry_restored():
    with METHODS.preserved():
        yield


def _cfg(method: dict, **kw):
    base = {"num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
            "wandb": {"mode": "disabled"}, "method": method}
    base.update(kw)
    return from_dict(base)


def test_linear_and_quadratic_linear_terms_give_their_hand_loss():
    w = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
    terms = {"a": Linear(torch.tensor([3.0, 4.0])),  # 3 + 8 = 11
             "b": Quadratic(2.0, torch.tensor([1.0]), linear=torch.tensor([-1.0]))}  # 2/2 * 4 - 3 = 1
    assert float(quadratic_loss(w, terms)) == pytest.approx(12.0)


def test_pad_samples_carries_extras_padded_with_zeros():
    one = Samples(torch.ones(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                  extra={"logits": torch.tensor([[1.0, 2.0], [3.0, 4.0]])})
    batch = pad_samples([one, None])
    assert batch.extra["logits"].shape == (2, 2, 2)
    assert batch.extra["logits"][0].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert batch.extra["logits"][1].abs().sum() == 0 and batch.weight[1].sum() == 0


def test_step_random_is_the_same_under_vmap_and_differs_between_clients_and_calls():
    keys = torch.tensor([11, 12])
    batched = vmap(lambda k: StepRandom(k, 5).uniform(4))(keys)
    assert torch.equal(batched[1], StepRandom(torch.tensor(12), 5).uniform(4))
    assert not torch.equal(batched[0], batched[1])
    rng = StepRandom(torch.tensor(11), 5)
    first, second = rng.uniform(4), rng.uniform(4)
    assert torch.equal(first, batched[0]) and not torch.equal(first, second)
    assert ((first >= 0) & (first < 1)).all()
    ints = StepRandom(torch.tensor(3), 1).integers(torch.tensor([1, 2, 3]), 3)
    assert ints[0] == 0 and (ints < torch.tensor([1, 2, 3])).all()


class Recorder(Method):
    """Records what the new hooks and arguments hand it, in its states."""

    name = "recorder38"
    sends = Sends(server_events=("start",), client_events=("round",))


    def server_event(self, ctx):
        ctx.server["started"] = torch.ones(())

    def client_end(self, ctx):
        params, state, training = ctx.params, ctx.state, ctx.training
        state["steps"] = torch.tensor(training.steps)
        state["lr"] = torch.tensor(training.lr)
        state["moved"] = sum((params[k] - training.global_params[k]).abs().sum() for k in params)
        state["classes"] = torch.tensor(self.run_info.num_classes)

    def count_bytes(self, ctx):
        return ctx.sizing.num_clients * 64 if ctx.kind == "client_state" else None


def test_server_event_start_and_client_end_training_reach_the_method():
    register(Recorder)
    stream = make_stream("task", num_tasks=2, n_train=60)
    runner = Runner(_cfg({"name": "recorder38"}, local_epochs=2), stream)
    assert runner.states[0].server["started"] == 1  # before round 1
    runner.run_round(0, 0)
    clients = runner.states[0].clients
    trained = [c for c in range(4) if "steps" in clients.get(c)]
    assert len(trained) == 3
    for c in trained:
        state = clients.get(c)
        # 60 samples over 4 clients: 15 each (iid), batches of 8: 2 a epoch, 2 epochs
        assert int(state["steps"]) == 4 and float(state["lr"]) == pytest.approx(0.1)
        assert float(state["moved"]) > 0  # the global model, not the trained one
        assert int(state["classes"]) == 3
    assert sizing_of(runner.cfg, stream, runner.model, runner.run_info.protected).num_classes == 3


class CarryReader(Method):
    """The step draw (``samples``' step part) sees the carry of the step (a counter the carry_step raises) and hands an
    extra through."""

    name = "carry-reader38"
    sends = Sends(client_events=())
    computes = Computes(starts=("carry",), draws=("step",))

    def client_start(self, ctx):
        return ClientStart(carry={"n": torch.zeros(())})

    def carry_step(self, step):
        seen = step.samples.extra["n"][0] if step.samples is not None else torch.zeros(())
        return {"n": step.carry["n"] + 1 + 0 * seen}

    def samples(self, ctx):
        carry = ctx.carry
        return Draw(step=Samples(torch.zeros(1, 12), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                       extra={"n": carry["n"].reshape(1)}))

    def step_gradient(self, step):
        # the step's draw holds the carry before the step: the step's index
        bad = (step.samples.extra["n"][0] - step.index).abs()
        return {k: g + bad * 1e6 for k, g in step.grads.items()}


@pytest.mark.parametrize("execution", ["batched", "sequential"])
def test_step_samples_reads_the_carry_and_passes_its_extras(execution):
    register(CarryReader)
    runner = Runner(_cfg({"name": "carry-reader38"}, client_execution=execution), make_stream("task", num_tasks=1))
    before = {k: v.clone() for k, v in runner.params.items()}
    runner.run_round(0, 0)
    assert all(torch.isfinite(v).all() and (v - before[k]).abs().max() < 10 for k, v in runner.params.items())
    assert int(runner.states[0].clients.get(next(iter(range(4))))["n"]) >= 0
