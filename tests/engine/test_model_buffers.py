"""BatchNorm running statistics through federated training (``model.buffers``): the engine against hand values.

The model here normalises its raw inputs (BatchNorm1d with running statistics, then a linear head), so each client's
running mean and variance depend on its data and batch order only: ``m <- 0.9 m + 0.1 mean(batch)``, ``v <- 0.9 v +
0.1 var(batch)`` (unbiased) per step, computed here in float64 from the engine's own schedule.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.func import functional_call

from cfl.config.schema import ConfigError
from cfl.engine.local.jobs import Hyper, client_schedule
from cfl.engine.local.sequential import train_sequential
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint
from cfl.heads import make_head
from cfl.models import MODELS, ModelShape
from cfl.models.buffers import load_global_model, running_stats
from cfl.validation import from_dict
from tests.conftest import make_stream

DIM = 5


class NormFirst(nn.Module):
    """BatchNorm1d (running statistics) on the flattened inputs, then a linear head."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        features = int(torch.Size(shape.input_shape).numel())
        self.norm = nn.BatchNorm1d(features)
        self.head = make_head(features, shape.classes, shape.num_tasks, shape.multi_head)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x.flatten(1)), task)


@contextmanager
def norm_first():
    with MODELS.temporarily("norm-first", NormFirst, about="test: BatchNorm on the inputs, linear head"):
        yield


def config(**extra: object):
    data = {"num_clients": 3, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "partition": {"name": "quantity", "beta": 0.5}, "model": {"name": "norm-first"},
            "wandb": {"mode": "disabled"}, **extra}
    return from_dict(data)


def stream(num_tasks: int = 1):
    return make_stream("task", num_tasks=num_tasks, n_train=40, dim=DIM)


def by_hand(start: dict, x: torch.Tensor, batches: list[torch.Tensor]) -> dict:
    """The running statistics after the client's steps, from ``start`` (float64)."""
    mean, var = start["norm.running_mean"].double(), start["norm.running_var"].double()
    for batch in batches:
        xb = x[batch].double()
        mean, var = 0.9 * mean + 0.1 * xb.mean(0), 0.9 * var + 0.1 * xb.var(0, unbiased=True)
    return {"norm.running_mean": mean, "norm.running_var": var,
            "norm.num_batches_tracked": start["norm.num_batches_tracked"] + len(batches)}


def hand_mean(clients: list[dict], sizes: list[int]) -> dict:
    """The server's weighted mean (sample counts); the batch count's rounded down."""
    total = sum(sizes)
    out = {k: sum(n * c[k] for c, n in zip(clients, sizes, strict=True)) / total
           for k in ("norm.running_mean", "norm.running_var")}
    out["norm.num_batches_tracked"] = torch.tensor(
        sum(n * int(c["norm.num_batches_tracked"]) for c, n in zip(clients, sizes, strict=True)) // total)
    return out


def assert_stats(engine: dict, hand: dict) -> None:
    assert engine.keys() == hand.keys()
    for k, v in hand.items():
        assert torch.allclose(engine[k].double(), v.double(), atol=1e-6), (k, engine[k], v)
    assert engine["norm.num_batches_tracked"].dtype == torch.long


def test_two_rounds_of_averaged_buffers_equal_the_hand_values(capsys):
    with norm_first():
        runner = Runner(config(), stream())
    assert "model buffers: 3 BatchNorm running-statistics tensors (48 bytes) averaged by the server" in \
        capsys.readouterr().err
    x = runner.stream.tasks[0].train_x
    hp = Hyper(0.1, 0.0, 0.0, 1, 7)
    expected = {k: v.clone() for k, v in runner.buffers.items()}
    assert expected["norm.running_var"].eq(1).all() and int(expected["norm.num_batches_tracked"]) == 0
    floored = False
    for rnd in range(2):
        jobs = runner.schedule.round_jobs(0, rnd)
        clients = [by_hand(expected, x, client_schedule(job, hp)) for job in jobs]
        sizes = [len(job.indices) for job in jobs]
        expected = hand_mean(clients, sizes)
        floored |= sum(n * int(c["norm.num_batches_tracked"]) for c, n in zip(clients, sizes, strict=True)) % sum(
            sizes) != 0
        record = runner.run_round(0, rnd)
        assert_stats(runner.buffers, expected)
        # bytes: the parameters and the buffers, down to each sampled client and up from each kept one
        per_client = sum(v.numel() * v.element_size() for v in [*runner.params.values(), *runner.buffers.values()])
        assert per_client == runner.model_bytes + 2 * DIM * 4 + 8
        assert record["round_download_bytes"] == record["round_upload_bytes"] == 2 * per_client
    assert floored  # the rounding down of num_batches_tracked was exercised
    # the hooks' template module holds the global statistics, and evaluation uses them in eval mode
    assert all(torch.equal(b, runner.buffers[k]) for k, b in runner.model.named_buffers())
    test = runner.stream.tasks[0]
    model = load_global_model(NormFirst(ModelShape((DIM,), 3, 1, True)), runner.params, runner.buffers).eval()
    hits = (model(test.test_x, torch.zeros(len(test.test_y), dtype=torch.long)).argmax(1) == test.test_y).sum()
    assert runner.evaluate(0) == [100.0 * int(hits) / len(test.test_y)]
    # the engine's evaluation forwards those statistics: not the initial ones (mean 0, variance 1)
    t = torch.zeros(len(test.test_y), dtype=torch.long)
    initial = {**runner.params, **running_stats(NormFirst(ModelShape((DIM,), 3, 1, True)))}
    assert not torch.allclose(functional_call(runner.model.eval(), initial, (test.test_x, t)), model(test.test_x, t))
    assert torch.equal(functional_call(runner.model.eval(), runner.state.global_tensors, (test.test_x, t)),
                       model(test.test_x, t))


def test_local_buffers_stay_with_each_client_and_are_not_sent_down(capsys):
    with norm_first():
        runner = Runner(config(model={"name": "norm-first", "buffers": "local"}, rounds_per_task=4), stream())
    assert "kept by each client (model.buffers: local, FedBN); evaluation and the server hooks use their " \
        "sample-weighted mean" in capsys.readouterr().err
    x = runner.stream.tasks[0].train_x
    hp = Hyper(0.1, 0.0, 0.0, 1, 7)
    initial = {k: v.clone() for k, v in runner.buffers.items()}
    own: dict[int, dict] = {}
    for rnd in range(4):
        jobs = runner.schedule.round_jobs(0, rnd)
        clients = [by_hand(own.get(job.cid, initial), x, client_schedule(job, hp)) for job in jobs]
        own.update({job.cid: c for job, c in zip(jobs, clients, strict=True)})
        record = runner.run_round(0, rnd)
        # nothing sent down but the parameters; the kept clients upload theirs for the global (evaluated) mean
        assert record["round_download_bytes"] == 2 * runner.model_bytes
        assert record["round_upload_bytes"] == 2 * (runner.model_bytes + 2 * DIM * 4 + 8)
        assert_stats(runner.buffers, hand_mean(clients, [len(job.indices) for job in jobs]))
    assert sorted(own) == runner.buffer_states.ids() == [0, 1, 2]  # every client has trained, each kept its own
    for cid, hand in own.items():
        assert_stats(runner.buffer_states.get(cid), hand)
    means = [runner.buffer_states.get(c)["norm.running_mean"] for c in range(3)]
    assert not torch.allclose(means[0], means[1]) and not torch.allclose(means[1], means[2])


@pytest.mark.parametrize("setting", ["averaged", "local"])
def test_resume_carries_the_buffers_bit_for_bit(tmp_path, setting):
    with norm_first():
        cfg = config(model={"name": "norm-first", "buffers": setting}, rounds_per_task=3, eval_every=1)
        reference = Runner(cfg, stream(2))
        reference.run()
        stopped = Runner(cfg, stream(2))
        stopped.should_stop = lambda: stopped.progress.global_round == 4
        stopped.run()
        checkpoint.save(tmp_path, checkpoint.capture(stopped.snapshot(), None))
        resumed = Runner(cfg, stream(2))
    resumed.resume(checkpoint.restore(resumed.snapshot(), checkpoint.load(tmp_path)))
    assert all(torch.equal(b, resumed.buffers[k]) for k, b in resumed.model.named_buffers())
    resumed.run()
    assert resumed.progress.evaluations == reference.progress.evaluations
    assert resumed.buffers.keys() == reference.buffers.keys()
    assert all(torch.equal(resumed.buffers[k], v) for k, v in reference.buffers.items())
    assert all(torch.equal(resumed.params[k], v) for k, v in reference.params.items())
    if setting == "local":
        assert resumed.buffer_states.ids() == reference.buffer_states.ids()
        for c in reference.buffer_states.ids():
            own = resumed.buffer_states.get(c)
            assert all(torch.equal(own[k], v) for k, v in reference.buffer_states.get(c).items())


def test_batched_and_sequential_runs_carry_the_same_buffers():
    with norm_first():
        batched = Runner(config(rounds_per_task=3), stream(2))
        sequential = Runner(replace(config(rounds_per_task=3), client_execution="sequential"), stream(2))
    assert batched.engine_path.path == "vmap" and sequential.engine_path.path == "sequential"
    batched.run()
    sequential.run()
    assert batched.buffers.keys() == sequential.buffers.keys()
    for k, v in sequential.buffers.items():
        assert torch.allclose(batched.buffers[k], v, atol=1e-6), k
    assert int(sequential.buffers["norm.num_batches_tracked"]) > 0


def test_a_model_without_running_statistics_carries_nothing():
    runner = Runner(config(model={"name": "digits-mlp"}), stream())
    assert runner.buffers == {} and runner.buffer_states is None
    record = runner.run_round(0, 0)
    assert record["round_download_bytes"] == record["round_upload_bytes"] == 2 * runner.model_bytes
    jobs = runner.schedule.round_jobs(0, 1)
    _, outcomes = train_sequential(runner.model, runner.params, jobs, runner.stream.tasks[0].train_x,
                                   runner.stream.tasks[0].train_y, 0, runner.hyper, _plugins(runner))
    assert all(o.buffers == {} for o in outcomes)


def _plugins(runner: Runner):
    from cfl.engine.local.jobs import RoundMethods

    return RoundMethods(runner.methods, runner.states, [{} for _ in runner.methods])


def test_client_forgetting_evaluates_each_client_with_its_own_statistics(monkeypatch):
    from cfl.metrics import client_forgetting

    seen: list[dict] = []
    real = client_forgetting.class_accuracy
    monkeypatch.setattr(client_forgetting, "class_accuracy", lambda model, params, *a: seen.append(params) or
                        real(model, params, *a))
    with norm_first():
        runner = Runner(config(client_forgetting_clients=2), stream())
    x = runner.stream.tasks[0].train_x
    initial = {k: v.clone() for k, v in runner.buffers.items()}
    jobs = runner.schedule.round_jobs(0, 0)
    clients = [by_hand(initial, x, client_schedule(job, Hyper(0.1, 0.0, 0.0, 1, 7))) for job in jobs]
    runner.run_round(0, 0)
    assert len(seen) == 3  # the global model (w_{t-1}: the initial statistics), then each client's trained model
    assert_stats({k: seen[0][k] for k in initial}, initial)
    for params, hand in zip(seen[1:], clients, strict=True):
        assert_stats({k: params[k] for k in initial}, hand)


def test_an_extra_loss_on_a_running_statistics_model_trains_sequentially_and_says_why():
    with norm_first():
        plain = Runner(config(), stream())
        distilling = Runner(config(method={"name": "fedlwf"}), stream())
    assert plain.engine_path.path == "vmap"
    assert distilling.engine_path.path == "sequential"
    assert "method fedlwf adds an extra loss" in distilling.engine_path.reason
    assert "BatchNorm running statistics" in distilling.engine_path.reason


def test_dropped_client_states_include_the_local_buffers(tmp_path):
    with norm_first():
        runner = Runner(config(model={"name": "norm-first", "buffers": "local"}), stream())
    runner.run()
    assert len(runner.buffer_states) == 3
    payload = checkpoint.capture(runner.snapshot(), None, client_states=False)
    assert payload["buffer_states"] == checkpoint.dropped(3)
    checkpoint.save(tmp_path, payload)
    with pytest.raises(ConfigError, match="dropped its client states"):
        checkpoint.load(tmp_path)
