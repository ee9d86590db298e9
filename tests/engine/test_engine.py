"""The round engine: batched and sequential client trainers agree; runs are deterministic."""

import pytest
import torch

from cfl.engine.rounds.round_draws import sample_clients
from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.server import NonFiniteError
from cfl.validation import from_dict
from tests.conftest import make_stream, run_both_paths


def _cfg(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "wandb": {"mode": "disabled"}}
    base.update(kw)
    return from_dict(base)


def _run(cfg, stream):
    runner = Runner(cfg, stream)
    runner.run()
    return runner


CASES = [
    {"method": {"name": "fedavg"}},
    {"method": {"name": "fedavg"}, "momentum": 0.9, "weight_decay": 1e-3, "local_epochs": 2},
    {"method": {"name": "fedprox", "mu": 0.5}},
    {"method": {"name": "fedavg"}, "partition": {"name": "quantity", "beta": 0.3}},  # ragged client sizes
    {"method": {"name": "fedavg"}, "loss": "tce", "partition": {"name": "shards"}},
    {"method": {"name": "fedavg"}, "aggregator": {"name": "gma", "tau": 0.5}},
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("scenario", ["task", "class", "domain"])
def test_batched_equals_sequential(case, scenario):
    stream = make_stream(scenario)
    run_both_paths(_cfg, stream, **case)


@pytest.mark.parametrize("precision", [32, "bf16-mixed"])
def test_same_seed_same_matrix_bit_for_bit_and_other_seed_differs(precision):
    stream = make_stream("task")
    a = _run(_cfg(precision=precision), stream)
    b = _run(_cfg(precision=precision), stream)
    assert a.progress.acc_matrix == b.progress.acc_matrix
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    other = _run(_cfg(seed=1, precision=precision), stream).params["body.1.weight"]
    assert not torch.equal(other, a.params["body.1.weight"])


def test_fedavg_round_is_the_weighted_mean_of_client_results():
    stream = make_stream("domain", num_tasks=1)
    cfg = _cfg(rounds_per_task=1, partition={"name": "quantity", "beta": 0.5})
    runner = Runner(cfg, stream)
    start = {k: v.clone() for k, v in runner.params.items()}
    from cfl.engine.local.jobs import ClientJob, RoundMethods, derive_seed
    from cfl.engine.local.sequential import train_one

    parts = runner.schedule.client_indices(0)
    cids = sample_clients(cfg.seed, 0, 0, cfg.num_clients, cfg.clients_per_round)
    results = []
    for c in cids:
        job = ClientJob(c, parts[c], None, derive_seed(cfg.seed, 0, 0, c))
        round_methods = RoundMethods(runner.methods, runner.states, [{}])
        results.append(train_one(runner.model, start, job, stream.tasks[0].train_x, stream.tasks[0].train_y, 0,
                                 runner.hyper, round_methods)[0])
    sizes = torch.tensor([float(len(parts[c])) for c in cids])
    runner.run()
    for k in start:
        expected = sum(s / sizes.sum() * r[k] for s, r in zip(sizes, results, strict=False))
        assert torch.allclose(runner.params[k], expected, atol=1e-6), k


def test_sampling_is_seeded_and_without_replacement():
    a = sample_clients(0, 1, 2, 50, 25)
    assert a == sample_clients(0, 1, 2, 50, 25) and len(set(a)) == 25
    assert a != sample_clients(0, 1, 3, 50, 25)


@pytest.mark.parametrize("execution", ["batched", "sequential"])
def test_task_incremental_heads_are_separate(execution):
    """Training a task moves only its own head; each task's logits come from its own head."""
    stream = make_stream("task")
    runner = Runner(_cfg(rounds_per_task=2, client_execution=execution), stream)
    start = {k: v.clone() for k, v in runner.params.items()}
    for task in range(2):
        for rnd in range(2):
            runner.run_round(task, rnd)
        after = runner.params
        trained = task
        other = 1 - task
        for k in ("head.weight", "head.bias"):
            assert not torch.equal(after[k][trained], start[k][trained]), (k, task)  # the task's head learnt
            assert torch.equal(after[k][other], start[k][other]), (k, task)  # the other head: bit for bit
        start = {k: v.clone() for k, v in after.items()}
    # each task's logits are its head applied to the shared features, and the two heads answer differently
    x = stream.tasks[0].test_x
    model = runner.model.eval()
    features = torch.func.functional_call(model.body, {k[5:]: v for k, v in after.items() if k.startswith("body.")},
                                          (x,))
    logits = [torch.func.functional_call(model, after, (x, torch.full((len(x),), t))) for t in range(2)]
    for t in range(2):
        expected = features @ after["head.weight"][t].T + after["head.bias"][t]
        assert torch.allclose(logits[t], expected, atol=1e-5)
    assert not torch.allclose(logits[0], logits[1], atol=1e-3)
    mixed = torch.func.functional_call(model, after, (x[:2], torch.tensor([0, 1])))  # per-sample heads
    assert torch.allclose(mixed, torch.stack([logits[0][0], logits[1][1]]), atol=1e-5)


def test_diverging_loss_stops_with_task_round_and_client():
    stream = make_stream("task")
    with pytest.raises(NonFiniteError, match=r"task 0 \(0-based\), round 1 of the task, client\(s\)"):
        _run(_cfg(lr=1e30), stream)


def test_skip_client_drops_nonfinite_updates_and_warns():
    stream = make_stream("task")
    runner = Runner(_cfg(on_nonfinite="skip_client"), stream)
    original = runner.run_round

    def poisoned(task, rnd):
        poison = runner.stream.tasks[task].train_x
        client0 = runner.schedule.client_indices(task)[0]
        saved = poison[client0].clone()
        poison[client0] = float("nan")
        try:
            return original(task, rnd)
        finally:
            poison[client0] = saved

    runner.run_round = poisoned
    with pytest.warns(UserWarning, match="update dropped"):
        runner.run()
    assert all(torch.isfinite(v).all() for v in runner.params.values())
