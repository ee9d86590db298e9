"""FedWeIT through the engine: parameters kept per client, frozen ones, each client's start, the sparse base
upload and its own aggregation, and the bytes of every payload against hand counts.

The run: blobs of 12 inputs, 2 tasks of 3 classes (task-incremental), ``fedweit-mlp`` (12-256-256, one head per
task), 4 clients, 3 per round, 2 rounds per task; the knowledge base has 3 slots (the clients per round)."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.engine.rounds.runner import Runner
from cfl.methods.base import RunInfo
from cfl.methods.training_hooks import ClientEndContext
from cfl.metrics.evaluate import accuracy
from cfl.tensors import Params
from tests.conftest import make_stream, tiny_config
from tests.helpers import Records

LAYERS = ("body.1", "body.3")  # the decomposed layers: 12 -> 256, 256 -> 256
SHARED = {"body.1.base": (256, 12), "body.3.base": (256, 256)}


def _runner(**kw: object) -> tuple[Runner, Records]:
    records = Records()
    cfg = tiny_config(**{"method": {"name": "fedweit"}, "num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2,
                         **kw})
    return Runner(cfg, make_stream("task", num_tasks=2, dim=12), [records]), records


@pytest.fixture(scope="module")
def run() -> tuple[Runner, Records, Params]:
    runner, records = _runner()
    template = {k: v.clone() for k, v in runner.params.items()}
    runner.run()
    return runner, records, template


def test_fedweit_runs_on_the_sequential_path_with_its_own_network(run):
    runner, _, _ = run
    assert runner.cfg.model.name == "fedweit-mlp"  # model: auto with fedweit
    assert runner.engine_path.path == "sequential" and "keeps parameters per client" in runner.engine_path.reason
    assert runner.client_params.frozen == {f"{p}.{n}" for p in LAYERS for n in ("kb", "kb_mix")}


def test_only_the_bases_are_aggregated_and_counted_as_the_model(run):
    runner, _, template = run
    assert runner.model_bytes == sum(math.prod(s) for s in SHARED.values()) * 4 == 274432
    for k, v in runner.params.items():
        assert torch.equal(v, template[k]) == (k not in SHARED), k  # the rest stays the template's


def test_each_client_keeps_its_own_parameters_and_evaluation_averages_their_models(run):
    runner, _, template = run
    clients = runner.states[0].clients
    owners = clients.ids()
    assert len(owners) >= 3
    locals_ = [clients.get(c)["local"] for c in owners]
    assert set(locals_[0]) == set(template) - set(SHARED)
    assert not torch.equal(locals_[0]["head.weight"], locals_[1]["head.weight"])  # trained apart
    own = [{**runner.params, **loc} for loc in locals_]
    data = runner.stream.tasks
    expected = [sum(accuracy(runner.model, p, data[j].test_x, data[j].test_y, j) for p in own) / len(own)
                for j in range(2)]
    assert runner.evaluate(1) == pytest.approx(expected)


def test_the_knowledge_base_is_loaded_at_a_new_task_and_never_trained(run):
    runner, _, _ = run
    kb = runner.states[0].server["kb"]
    for c in runner.states[0].clients.ids():
        state = runner.states[0].clients.get(c)
        if state["task"] == 1:  # trained in task 1: its knowledge base is the server's, untouched by the steps
            for p in LAYERS:
                assert torch.equal(state["local"][f"{p}.kb"], kb[p])
                assert state["anchors"][p].shape[0] == 1


def _kb_entry_bytes(tensors: list[torch.Tensor]) -> int:
    """Hand count of an element-sparse entry (bitmap): a bit per entry, 4 bytes per nonzero value."""
    return sum(math.ceil(t.numel() / 8) + 4 * int(torch.count_nonzero(t)) for t in tensors)


def test_bytes_match_hand_counts(run):
    """Each round: up, per client and layer, the kept units' rows (n = 256 units, sparsity 0.3: 256 - 76 - 1 = 179
    without ties) and a 256-bit bitmap; down, the dense bases to each client, plus the knowledge base to a client at
    its first round of task 1. The task end: each participant's pruned A (bitmap encoding)."""
    runner, records, _ = run
    per_client_up = 179 * 12 * 4 + 32 + 179 * 256 * 4 + 32
    assert per_client_up == 191952
    for r in records.rounds:
        assert r["round_upload_bytes"] == 3 * per_client_up, r
    kb = runner.states[0].server["kb"]
    kb_bytes = sum(_kb_entry_bytes([kb[p][k] for p in LAYERS]) for k in range(3))
    first_in_task1 = 3  # every client of task 1's first round gets it then, and no later round resends it
    task1 = [r for r in records.rounds if r["task"] == 1]
    assert task1[0]["round_download_bytes"] == 3 * 274432 + first_in_task1 * kb_bytes
    seen = set(runner.schedule.round_jobs(1, 0)[i].cid for i in range(3))
    new = [j.cid for j in runner.schedule.round_jobs(1, 1) if j.cid not in seen]
    assert task1[1]["round_download_bytes"] == 3 * 274432 + len(new) * kb_bytes
    for r in records.rounds:
        if r["task"] == 0:
            assert r["round_download_bytes"] == 3 * 274432
    task_end_up = sum(_kb_entry_bytes([kb[p][k] for p in LAYERS]) for k in range(3))  # the entries are the uploads
    rounds_up = sum(r["round_upload_bytes"] for r in records.rounds)
    assert runner.comm.upload_bytes == rounds_up + task_end_up


def test_a_client_that_did_not_train_the_task_sends_no_knowledge():
    from cfl.methods.base import ClientData
    from cfl.methods.fedweit import FedWeIT, FedWeITHyperparams
    from cfl.models.fedweit_net import FedWeITMLP

    net = FedWeITMLP(4, [3], classes=2, num_tasks=2, kb_size=2)
    method = FedWeIT(FedWeITHyperparams(), RunInfo(2, "task", 3, 2, 0, net))
    state = {"task": 0, "local": {"body.1.adaptive": torch.ones(2, 3, 4)}}
    data = ClientData(torch.zeros(0), torch.zeros(0), 1)
    assert method.client_end(ClientEndContext("task_end", None, {}, data, state, {}, torch.Generator())) is None


def test_frozen_parameters_take_no_optimiser_state():
    runner, _ = _runner(optimizer={"name": "adam", "state": "kept"}, rounds_per_task=1)
    runner.run_round(0, 0)
    kept = runner.optimizer_states.get(runner.optimizer_states.ids()[0])
    assert "body.1.kb" not in kept["slots"] and "body.1.adaptive" in kept["slots"]


def test_the_state_estimate_bounds_what_the_clients_keep(run):
    """Per client: its local parameters and own base (one model: 274432 bytes of bases and the rest), one past
    task's anchors (bases) and two numbers; the estimate allows num_tasks anchors."""
    runner, _, _ = run
    clients = runner.states[0].clients
    kept = sum(clients.nbytes(c) for c in clients.ids())
    model = sum(v.numel() * v.element_size() for v in runner.params.values())
    assert runner.state_estimate[0] == 4 * (model + 2 * 274432 + 64)
    assert model * len(clients.ids()) < kept <= runner.state_estimate[0]
