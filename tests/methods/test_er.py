"""ER+FL: balanced bounded memory, replay batches (mix, labels, heads, seeded draws), engines agree."""

from collections import Counter

import pytest
import torch

from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.sequential import train_one
from cfl.engine.local.stacking import pad_samples
from cfl.engine.rounds.runner import Runner
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.episodic_memory import balanced_quota
from cfl.methods.er import ER, ERHyperparams
from cfl.methods.training_hooks import ClientEndContext, SamplesContext
from cfl.metrics.results import method_stats
from cfl.models.mlp import MLP
from cfl.records.client_states import MethodState
from cfl.records.comm import CommLedger
from cfl.validation import from_dict
from tests.conftest import make_stream, run_both_paths


def _er(mem=12, replay=5, model=None):
    return ER(ERHyperparams(mem_per_client=mem, replay_batch_size=replay), RunInfo(3, "task", 2, 2, 0, model))


def _end(er, data, state, generator, model=None, params=None):
    er.client_end(ClientEndContext("task_end", model, params or {}, data, state, {}, generator))


def _task_data(task, per_class=10, classes=3):
    """x encodes (task, class, index) so every memory row can be traced back to its origin."""
    y = torch.arange(classes).repeat_interleave(per_class)
    idx = torch.arange(classes * per_class)
    x = torch.stack([torch.full_like(y, task), y, idx], 1).float()
    return ClientData(x, y, task)


def _groups(state):
    n = int(state["valid"].sum())
    return Counter((int(t), int(c)) for t, c in zip(state["task"][:n], state["y"][:n], strict=True))


def test_balanced_quota_splits_equally_and_passes_on_what_a_group_cannot_take():
    assert balanced_quota(10, [5, 5, 5]) == [4, 3, 3]
    assert balanced_quota(10, [1, 10, 10]) == [1, 5, 4]
    assert balanced_quota(3, [0, 5]) == [0, 3]
    assert balanced_quota(50, [2, 3]) == [2, 3]


def test_memory_stays_balanced_over_tasks_and_classes_and_bounded():
    er, state = _er(mem=12), {}
    _end(er, _task_data(0), state, torch.Generator().manual_seed(0))
    assert _groups(state) == {(0, 0): 4, (0, 1): 4, (0, 2): 4}
    first = state["x"].clone()
    _end(er, _task_data(1), state, torch.Generator().manual_seed(1))
    assert _groups(state) == {(0, c): 2 for c in range(3)} | {(1, c): 2 for c in range(3)}
    kept = {tuple(r.tolist()) for r in state["x"][state["task"] == 0]}
    assert kept <= {tuple(r.tolist()) for r in first}  # old samples are kept, never re-drawn
    _end(er, _task_data(2), state, torch.Generator().manual_seed(2))
    counts = _groups(state)
    assert sum(counts.values()) == 12 and state["x"].shape[0] == 12
    assert [sum(v for (t, _), v in counts.items() if t == task) for task in range(3)] == [4, 4, 4]
    assert max(counts.values()) - min(counts.values()) <= 1
    rows = state["x"][state["valid"]]
    assert torch.equal(rows[:, 0].long(), state["task"][state["valid"]])  # task id travels with the sample
    assert torch.equal(rows[:, 1].long(), state["y"][state["valid"]])


def test_memory_with_one_class_short_gives_its_share_to_the_others():
    er, state = _er(mem=12), {}
    data = _task_data(0)
    few = torch.cat([torch.arange(0, 2), torch.arange(10, 30)])  # class 0 has only 2 samples
    _end(er, ClientData(data.x[few], data.y[few], 0), state, torch.Generator())
    assert _groups(state) == {(0, 0): 2, (0, 1): 5, (0, 2): 5}


def test_replay_batch_mixes_memory_with_weights_and_pads_an_empty_client():
    er, state = _er(mem=12, replay=5), {}
    _end(er, _task_data(0), state, torch.Generator().manual_seed(0))
    draws = [er.samples(SamplesContext("replay", state, torch.Generator().manual_seed(3), {}, {})).replay,
             er.samples(SamplesContext("replay", {}, torch.Generator().manual_seed(4), {}, {})).replay]
    batch = pad_samples(draws)  # the engine pads the clients' draws
    assert batch.x.shape == (2, 5, 3) and batch.weight.tolist() == [[1.0] * 5, [0.0] * 5]
    rows = batch.x[0]
    assert len({tuple(r.tolist()) for r in rows}) == 5  # drawn without replacement
    assert torch.equal(rows[:, 1].long(), batch.y[0]) and torch.equal(rows[:, 0].long(), batch.task[0])
    alone = er.samples(SamplesContext("replay", state, torch.Generator().manual_seed(3), {}, {})).replay
    assert torch.equal(alone.x, batch.x[0])  # a client's draw does not depend on who trains alongside
    assert pad_samples([er.samples(SamplesContext("replay", {}, torch.Generator(), {}, {})).replay, None]) is None


def test_replay_draws_uniformly_from_the_whole_memory():
    """ A replay batch is a random draw without replacement from all valid memory rows
    (the generator's), not the first rows: over 240 draws of 5 from 12 rows each row comes ~100 times."""
    er, state = _er(mem=12, replay=5), {}
    _end(er, _task_data(0), state, torch.Generator().manual_seed(0))
    rows = {tuple(r.tolist()): i for i, r in enumerate(state["x"])}
    counts = Counter(rows[tuple(r.tolist())] for seed in range(240)
                     for r in er.samples(SamplesContext("replay", state, torch.Generator().manual_seed(seed), {},
                                                        {})).replay.x)
    assert sorted(counts) == list(range(12))  # every memory row is drawn
    assert all(60 <= c <= 140 for c in counts.values()), counts  # expected 240 * 5 / 12 = 100 each
    again = er.samples(SamplesContext("replay", state, torch.Generator().manual_seed(7), {}, {})).replay.x
    assert torch.equal(again, er.samples(SamplesContext("replay", state, torch.Generator().manual_seed(7), {},
                                                        {})).replay.x)  # the generator decides


def test_small_memory_gives_a_short_replay_batch():
    er, state = _er(mem=3, replay=5), {}
    _end(er, _task_data(0), state, torch.Generator())
    assert len(er.samples(SamplesContext("replay", state, torch.Generator(), {}, {})).replay.y) == 3
    batch = pad_samples([er.samples(SamplesContext("replay", state, torch.Generator(), {}, {})).replay,
                         er.samples(SamplesContext("replay", {}, torch.Generator(), {}, {})).replay])
    assert batch.weight.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_replayed_samples_train_their_own_task_head():
    torch.manual_seed(0)
    model = MLP(3, [4], 2, num_tasks=2, multi_head=True)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    er = _er(mem=6, replay=4, model=model)
    data = _task_data(0, per_class=5, classes=2)
    x1, y1 = torch.randn(8, 3), torch.tensor([0, 1] * 4)
    job = ClientJob(0, torch.arange(8), None, 0)
    hp = Hyper(0.1, 0.0, 0.0, 1, 8)
    moved = []
    for with_memory in (False, True):
        states = [MethodState()]
        if with_memory:
            state = {}
            _end(er, data, state, torch.Generator(), model, params)
            states[0].clients.put(0, state)
        out, _ = train_one(model, params, job, x1, y1, 1, hp, RoundMethods([er], states, [{}]))
        moved.append(not torch.equal(out["head.weight"][0], params["head.weight"][0]))
    assert moved == [False, True]  # training on task 1 touches head 0 only through replayed task-0 samples


def test_state_size_in_method_stats():
    er, state = _er(mem=12), {}
    _end(er, _task_data(0), state, torch.Generator())
    ms = MethodState()
    ms.clients.put(0, state)
    ms.clients.put(1, {})
    stats = method_stats(CommLedger(), er, ms)
    assert stats["client_state_bytes_max"] == 12 * 3 * 4 + 12 * 8 * 2 + 12 and stats["clients_with_state"] == 1


def _cfg(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "stream": {"name": "permuted-digits", "num_tasks": 3}, "wandb": {"mode": "disabled"},
            "method": {"name": "er", "mem_per_client": 10, "replay_batch_size": 4}}
    base.update(kw)
    return from_dict(base)


@pytest.mark.parametrize(("scenario", "extra"), [("task", {}), ("class", {}),
                                                 ("domain", {"partition": {"name": "quantity", "beta": 0.3}})])
def test_batched_equals_sequential(scenario, extra):
    stream = make_stream(scenario, num_tasks=3)
    runs = run_both_paths(_cfg, stream, **extra)
    clients = runs[0].states[0].clients
    filled = sum(int(clients.get(c)["valid"].sum()) for c in clients.ids()) / len(clients)
    assert filled == 10 if not extra else 0 < filled <= 10  # quantity skew: some clients hold fewer samples


def test_er_task_end_downloads_nothing():
    from cfl.validation import from_dict
    from tests.conftest import make_stream

    def traffic(method):
        cfg = from_dict({"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 8,
                         "wandb": {"mode": "disabled"}, "method": method})
        runner = Runner(cfg, make_stream("task", num_tasks=2))
        runner.run()
        return runner.comm.download_bytes, runner.model_bytes

    er, model_bytes = traffic({"name": "er", "mem_per_client": 6, "replay_batch_size": 4})
    fedavg, _ = traffic({"name": "fedavg"})
    assert er == fedavg == 2 * 2 * model_bytes  # 2 rounds x 2 clients, no task-end download
