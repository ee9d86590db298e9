"""GLFC on task- and domain-incremental streams (cfl's adaptation, docs/methods/glfc.md): classes named by global id
``task x classes + label`` in the memory, the learned mask, the LeNet labels and the monitor set; the loss's old group
= samples of finished tasks, each on its own head; a tiny run of each scenario."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

from cfl.engine.rounds.runner import Runner
from cfl.methods.base import ClientData, RunInfo
from cfl.methods.glfc import GLFC, GLFCHyperparams
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.models.mlp import MLP
from cfl.ops.features import head_features
from cfl.ops.glfc_losses import glfc_loss_by_task
from cfl.ops.glfc_memory import herding
from cfl.ops.glfc_proxy import infer_label
from tests.conftest import make_stream, tiny_config

FAST = {"perturb_steps": 2, "reconstruction_steps": 2, "reconstructions_kept": 1, "reconstruction_iterations": 2}
SCENARIOS = ("task", "domain")


def make(scenario: str, memory_size: int = 4) -> tuple[GLFC, MLP, dict]:
    """Two tasks of two classes: one head per task (task-incremental) or one shared head (domain-incremental)."""
    torch.manual_seed(0)
    model = MLP(16, [6], 2, num_tasks=2, multi_head=scenario == "task")
    info = RunInfo(num_tasks=2, scenario=scenario, num_clients=2, clients_per_round=2, seed=0, model=model,
                   batch_size=4)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return GLFC(GLFCHyperparams(memory_size=memory_size, **FAST), info), model, params


def data(task: int, seed: int = 0) -> ClientData:
    """Labels 0 and 1, four samples each (the same labels every task)."""
    y = torch.tensor([0, 1]).repeat_interleave(4)
    return ClientData(torch.rand(len(y), 16, generator=torch.Generator().manual_seed(seed)), y, task)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_old_group_is_the_samples_of_the_classes_of_finished_tasks(scenario):
    """Learned: task 0's label 0 (global id 0) only. Batch: labels 0, 1 of task 1 and 0, 1 of task 0: only the third
    is old (a class-wise grouping would make the first old too); the old model scored on each sample's own head."""
    method, model, params = make(scenario)
    x, y, task = torch.rand(4, 16), torch.tensor([0, 1, 0, 1]), torch.tensor([1, 1, 0, 0])
    logits, weight, seen = model(x, task), torch.ones(4), torch.ones(2, dtype=torch.bool)
    state = {"learned": torch.tensor([True, False, False, False])}
    old_samples = torch.tensor([False, False, True, False])
    got = method.loss(LossContext("task", params, x, task, weight, {}, state, logits=logits, y=y, allowed=None)).task
    torch.testing.assert_close(got, glfc_loss_by_task(logits, y, weight, seen, old_samples, torch.tensor(True), None))
    old = {k: v + 0.1 for k, v in params.items()}
    got = method.loss(LossContext("task", params, x, task, weight, {"old_model": old}, state, logits=logits, y=y,
                                  allowed=None)).task
    old_logits = functional_call(model, old, (x, task))
    torch.testing.assert_close(got, glfc_loss_by_task(logits, y, weight, seen, old_samples, torch.tensor(True),
                                                      old_logits))
    fresh = method.loss(LossContext("task", params, x, task, weight, {}, {}, logits=logits, y=y,
                                    allowed=None)).task  # no finished task: every w_i = 1
    torch.testing.assert_close(fresh, glfc_loss_by_task(logits, y, weight, seen, torch.zeros(4, dtype=torch.bool),
                                                        torch.tensor(False), None))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_memory_keeps_each_tasks_classes_apart(scenario):
    """Memory of 4: after task 0, two herded exemplars of labels 0 and 1; after task 1 (the same labels) one of each
    of the four global classes, the older sets keeping their first exemplar."""
    method, model, params = make(scenario)
    state: dict = {}
    first, second = data(0), data(1, seed=1)
    method.client_end(ClientEndContext("task_end", model, params, first, state, {}, torch.Generator()))
    features, _ = head_features(model, params, first.x, 0)
    picks = {c: torch.nonzero(first.y == c).flatten()[herding(features[first.y == c], 2)] for c in (0, 1)}
    torch.testing.assert_close(state["x"], first.x[torch.cat([picks[0], picks[1]])])
    assert state["learned"].tolist() == [True, True, False, False]

    method.client_end(ClientEndContext("task_end", model, params, second, state, {}, torch.Generator()))
    features, _ = head_features(model, params, second.x, 1)
    new = [torch.nonzero(second.y == c).flatten()[herding(features[second.y == c], 1)] for c in (0, 1)]
    assert state["y"].tolist() == [0, 1, 0, 1] and state["task"].tolist() == [0, 0, 1, 1] and state["valid"].all()
    torch.testing.assert_close(state["x"], torch.cat([first.x[torch.stack([picks[0][0], picks[1][0]])],
                                                      second.x[torch.cat(new)]]))
    assert state["learned"].all()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_proxy_labels_by_global_id_and_scores_each_sample_on_its_tasks_head(scenario):
    """Task 1's upload is labelled 2 and 3 (task 1 x 2 classes + 0, 1); the server scores a model that says label 0
    everywhere on task 1's head (task-incremental) or the shared head as half right."""
    method, model, params = make(scenario)
    upload = method.client_end(ClientEndContext("round", model, params, data(1), {}, {"round_in_task": 0},
                                                torch.Generator()))
    assert [infer_label(g[-2]) for g in upload["gradients"]] == [2, 3]
    server: dict = {}
    says_0 = {k: v.clone() for k, v in params.items()}
    says_0["head.bias"] = torch.tensor([[0.0, 100.0], [100.0, 0.0]]) if scenario == "task" else torch.tensor([100.0, 0])
    method.server_event(ServerEvent("round", server, 1, says_0, {0: upload}, model))
    assert server["monitor_y"].tolist() == [2, 3]
    assert server["best_score"] == 0.5
    method.server_event(ServerEvent("task_end", server, 1, params))
    assert torch.equal(server["old_model"]["head.bias"], says_0["head.bias"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_tiny_run(scenario):
    """Three tasks of three classes (the same labels every task), one round each: the run finishes, a client's
    memory holds tasks 0 and 1's classes apart (global ids 0..5), the proxy reconstructed task 2's uploads (global
    ids 6..8) and handed task 1's best model over as the old model."""
    cfg = tiny_config(num_clients=4, clients_per_round=2, rounds_per_task=1, model={"name": "mlp"},
                      method={"name": "glfc", "memory_size": 6, "perturb_steps": 1, "reconstruction_steps": 1,
                              "reconstructions_kept": 1, "reconstruction_iterations": 2})
    runner = Runner(cfg, make_stream(scenario, num_tasks=3, n_train=60, dim=16))
    runner.run()
    assert all(acc is not None for t, row in enumerate(runner.progress.acc_matrix) for acc in row[: t + 1])
    server, clients = runner.states[0].server, runner.states[0].clients
    assert set(server["monitor_y"].tolist()) <= {6, 7, 8} and "old_model" in server
    memory = clients.get(0)
    ids = (memory["task"] * 3 + memory["y"])[memory["valid"]]
    assert sorted(set(ids.tolist())) == [0, 1, 2, 3, 4, 5] and memory["learned"].tolist() == [True] * 6 + [False] * 3


def _by_task_code_loss(z: list[list[float]], old: list[list[float]], y: list[int], is_old: list[bool]) -> float:
    """cfl's task/domain adaptation in the code form, transcribed in Python floats: groups by task (a memory sample
    of a finished task is old), L_RD's target on an old sample its whole row of old sigmoids, on a new one the
    one-hot label; batch mean of ``0.5 L_GC + 0.5 L_RD``."""
    def sigmoid(v: float) -> float:
        return 1 / (1 + math.exp(-v))

    def bce(v: float, t: float) -> float:
        return max(v, 0.0) - v * t + math.log1p(math.exp(-abs(v)))

    n, c = len(z), len(z[0])
    g = [abs(sigmoid(z[i][y[i]]) - 1) for i in range(n)]
    w = [g[i] / (sum(g[k] for k in range(n) if is_old[k] == is_old[i]) / is_old.count(is_old[i])) for i in range(n)]
    total = 0.0
    for i in range(n):
        onehot = [1.0 if j == y[i] else 0.0 for j in range(c)]
        target = [sigmoid(old[i][j]) for j in range(c)] if is_old[i] else onehot
        gc = w[i] * sum(bce(z[i][j], onehot[j]) for j in range(c)) / c
        rd = sum(bce(z[i][j], target[j]) for j in range(c)) / c
        total += 0.5 * gc + 0.5 * rd
    return total / n


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_loss_is_unchanged_by_the_class_incremental_distillation_of_every_finished_class(scenario):
    """The class-incremental L_RD changed alone: here no ``old_classes`` is recorded at a task end, and
    the loss of a client that learned task 0's label 0 only is the adaptation's formula (its memory sample of label 1
    of task 0 would be old under the class-incremental rule; it is new here, distilled as a one-hot)."""
    method, model, params = make(scenario)
    model.double()
    params = {k: v.double() for k, v in params.items()}
    server: dict = {}
    method.server_event(ServerEvent("before_task_end", server, 0, params, model=model, classes=torch.tensor([0, 1])))
    assert server == {}
    gen = torch.Generator().manual_seed(3)
    x, y, task = torch.randn(5, 16, generator=gen, dtype=torch.float64), torch.tensor([0, 1, 0, 1, 1]), \
        torch.tensor([0, 0, 1, 1, 1])
    logits, weight = functional_call(model, params, (x, task)), torch.ones(5, dtype=torch.float64)
    old = {k: v + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in params.items()}
    state = {"learned": torch.tensor([True, False, False, False])}
    got = method.loss(LossContext("task", params, x, task, weight, {"old_model": old}, state, logits=logits, y=y,
                                  allowed=None)).task.mean()
    old_logits = functional_call(model, old, (x, task))
    want = _by_task_code_loss(logits.tolist(), old_logits.tolist(), y.tolist(), [True, False, False, False, False])
    assert abs(got.item() - want) < 1e-12
