"""The GLFC method's hooks, called directly (the method is not registered until the engine calls ``loss`` and
``server_event("round")``): the loss in place of the cross-entropy, the herding memory over two tasks, the first-round
upload, the proxy server's monitor set, best model and old model, and the ablation without the proxy."""

from __future__ import annotations

import math

import torch
from torch.func import functional_call

from cfl.methods.base import ClientData, RunInfo
from cfl.methods.glfc import GLFC, GLFCHyperparams
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import ClientEndContext, LossContext, SamplesContext
from cfl.models.mlp import MLP
from cfl.ops.features import head_features
from cfl.ops.glfc_losses import glfc_loss
from cfl.ops.glfc_memory import herding
from cfl.ops.glfc_proxy import infer_label

FAST = {"perturb_steps": 2, "reconstruction_steps": 2, "reconstructions_kept": 1}


def make(memory_size: int = 4, scenario: str = "class", **hp) -> tuple[GLFC, MLP, dict]:
    torch.manual_seed(0)
    model = MLP(16, [6], 4)
    info = RunInfo(num_tasks=2, scenario=scenario, num_clients=2, clients_per_round=2, seed=0, model=model,
                   batch_size=4)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return GLFC(GLFCHyperparams(memory_size=memory_size, **{**FAST, **hp}), info), model, params


def data(classes: list[int], task: int, per_class: int = 4, seed: int = 0) -> ClientData:
    gen = torch.Generator().manual_seed(seed)
    y = torch.tensor(classes).repeat_interleave(per_class)
    return ClientData(torch.rand(len(y), 16, generator=gen), y, task)


def test_the_loss_replaces_the_cross_entropy_and_distils_once_an_old_model_exists():
    method, model, params = make()
    x, y = torch.rand(5, 16), torch.tensor([0, 1, 2, 2, 3])
    task, weight = torch.zeros(5, dtype=torch.long), torch.ones(5)
    logits = model(x, task)
    seen = torch.tensor([True, True, True, False])
    state = {"learned": torch.tensor([True, True, False, False])}
    got = method.loss(LossContext("task", params, x, task, weight, {}, state, logits=logits, y=y, allowed=seen)).task
    torch.testing.assert_close(got, glfc_loss(logits, y, weight, seen, state["learned"], state["learned"], None))
    old = {k: v + 0.1 for k, v in params.items()}
    finished = torch.tensor([True, True, False, False])
    server = {"old_model": old, "old_classes": finished}
    got = method.loss(LossContext("task", params, x, task, weight, server, state, logits=logits, y=y,
                                  allowed=seen)).task
    old_logits = functional_call(model, old, (x, task))
    torch.testing.assert_close(got, glfc_loss(logits, y, weight, seen, state["learned"], finished, old_logits))
    nothing = torch.zeros(4, dtype=torch.bool)
    fresh = method.loss(LossContext("task", params, x, task, weight, {}, {}, logits=logits, y=y,
                                    allowed=seen)).task  # a client that learned nothing
    torch.testing.assert_close(fresh, glfc_loss(logits, y, weight, seen, nothing, nothing, None))


def _official_compute_loss(output: list[list[float]], old_output: list[list[float]], label: list[int],
                           learned_classes: list[int]) -> float:
    """The official ``_compute_loss`` (conditionWang/FCIL, src/GLFC.py) with an old model, transcribed in Python
    floats: ``output`` N x numclass, ``old_output`` N x (the old model's classes)."""
    def sigmoid(z: float) -> float:
        return 1 / (1 + math.exp(-z))

    def bce(z: float, t: float) -> float:
        return max(z, 0.0) - z * t + math.log1p(math.exp(-abs(z)))

    n, c = len(output), len(output[0])
    target = [[1.0 if j == label[i] else 0.0 for j in range(c)] for i in range(n)]
    g = [abs(sigmoid(output[i][label[i]]) - 1) for i in range(n)]
    old_group = [label[i] in learned_classes for i in range(n)]
    w = []
    for i in range(n):
        group = [k for k in range(n) if old_group[k] == old_group[i]]
        w.append(g[i] / (sum(g[k] for k in group) / len(group)))
    loss_cur = sum(w[i] * bce(output[i][j], target[i][j]) for i in range(n) for j in range(c)) / (n * c)
    distill = [[sigmoid(old_output[i][j]) if j < len(old_output[i]) else target[i][j] for j in range(c)]
               for i in range(n)]
    loss_old = sum(bce(output[i][j], distill[i][j]) for i in range(n) for j in range(c)) / (n * c)
    return 0.5 * loss_cur + 0.5 * loss_old


def test_the_distillation_covers_every_class_of_the_finished_tasks_as_the_official_code():
    """The audit's batch: 6 classes seen (3 tasks of 2), an old model of the 4 classes of tasks 0 and 1, a client that
    learned only {0, 1} (it held no class of task 1); 7 samples of its memory (0, 1) and of task 2 (4, 5). The
    official loss distils classes 2 and 3 too (their target is the old model's sigmoid, not 0); the client's learned
    classes only group L_GC's weights."""
    torch.manual_seed(0)
    model = MLP(16, [6], 6).double()
    info = RunInfo(num_tasks=3, scenario="class", num_clients=2, clients_per_round=2, seed=0, model=model,
                   batch_size=7)
    method = GLFC(GLFCHyperparams(**FAST), info)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    old = {k: v + 0.3 * torch.randn_like(v) for k, v in params.items()}
    x, y = torch.randn(7, 16, dtype=torch.float64), torch.tensor([0, 1, 1, 4, 5, 5, 4])
    task, weight = torch.zeros(7, dtype=torch.long), torch.ones(7, dtype=torch.float64)
    logits = functional_call(model, params, (x, task))
    seen = torch.ones(6, dtype=torch.bool)
    state = {"learned": torch.tensor([True, True, False, False, False, False])}
    server = {"old_model": old, "old_classes": torch.tensor([True, True, True, True, False, False])}
    got = method.loss(LossContext("task", params, x, task, weight, server, state, logits=logits, y=y,
                                  allowed=seen)).task.mean()
    old_logits = functional_call(model, old, (x, task))
    want = _official_compute_loss(logits.tolist(), old_logits[:, :4].tolist(), y.tolist(), [0, 1])
    assert abs(got.item() - want) < 1e-12


def test_a_task_end_records_the_old_models_classes():
    """Class-incremental: the classes seen by the finished task become ``old_classes`` with the old model (the
    ablation's last global model here); none while no old model is made."""
    method, model, params = make(proxy=False)
    server: dict = {}
    method.server_event(ServerEvent("before_task_end", server, 0, params, model=model, classes=torch.tensor([0, 1])))
    method.server_event(ServerEvent("task_end", server, 0, params))  # no global model kept yet: no old model, classes
    assert "old_model" not in server and "old_classes" not in server
    method.server_event(ServerEvent("round", server, 1, params, {}, model))
    method.server_event(ServerEvent("before_task_end", server, 1, params, model=model,
                                    classes=torch.tensor([0, 1, 2])))
    method.server_event(ServerEvent("task_end", server, 1, params))
    assert server["old_classes"].tolist() == [True, True, True, False] and "old_model" in server
    assert "old_classes" in method.sends.broadcast["round"]


def test_the_memory_over_two_tasks():
    """Memory of 4: after task 0 (classes 0, 1) two herded exemplars per class; after task 1 (classes 2, 3) one per
    class, the older sets keeping their first exemplar."""
    method, model, params = make(memory_size=4)
    state: dict = {}
    first = data([0, 1], 0)
    method.client_end(ClientEndContext("task_end", model, params, first, state, {}, torch.Generator()))
    features, _ = head_features(model, params, first.x, 0)
    picks = {c: torch.nonzero(first.y == c).flatten()[herding(features[first.y == c], 2)] for c in (0, 1)}
    assert state["y"].tolist() == [0, 0, 1, 1] and state["valid"].all()
    torch.testing.assert_close(state["x"], first.x[torch.cat([picks[0], picks[1]])])
    assert state["learned"].tolist() == [True, True, False, False]

    second = data([2, 3], 1, seed=1)
    method.client_end(ClientEndContext("task_end", model, params, second, state, {}, torch.Generator()))
    assert state["y"].tolist() == [0, 1, 2, 3] and state["task"].tolist() == [0, 0, 1, 1] and state["valid"].all()
    torch.testing.assert_close(state["x"][:2], first.x[torch.stack([picks[0][0], picks[1][0]])])
    assert state["learned"].all()
    replayed = method.samples(SamplesContext("replay", state, torch.Generator().manual_seed(0), {}, {})).replay
    assert sorted(replayed.y.tolist()) == [0, 1, 2, 3]  # replay_batch_size null: the run's batch_size, 4


def test_the_first_round_of_a_task_uploads_one_labelled_gradient_per_class():
    method, model, params = make()
    mine = data([1, 3], 0)
    upload = method.client_end(ClientEndContext("round", model, params, mine, {}, {"round_in_task": 0},
                                                torch.Generator()))
    assert [infer_label(g[-2]) for g in upload["gradients"]] == [1, 3]
    assert method.client_end(ClientEndContext("round", model, params, mine, {}, {"round_in_task": 1},
                                              torch.Generator())) is None
    off, model, params = make(proxy=False)
    assert off.client_end(ClientEndContext("round", model, params, mine, {}, {"round_in_task": 0},
                                           torch.Generator())) is None


def test_the_proxy_keeps_the_best_model_and_hands_it_over_at_the_task_end():
    method, model, params = make()
    upload = method.client_end(ClientEndContext("round", model, params, data([1, 3], 0), {}, {"round_in_task": 0},
                                                torch.Generator()))
    server: dict = {}

    def always(c):  # a model predicting class c everywhere: a large bias on c
        p = {k: v.clone() for k, v in params.items()}
        p["head.bias"] = torch.where(torch.arange(4) == c, 100.0, 0.0)
        return p

    method.server_event(ServerEvent("round", server, 0, always(1), {0: upload}, model))  # half the monitor set right
    assert server["monitor_x"].shape == (2, 16) and server["monitor_y"].tolist() == [1, 3]
    assert server["round_in_task"] == 1 and server["stats"]["reconstructions"] == 2
    assert server["stats"]["reconstruction_seconds"] > 0
    assert server["best_score"] == 0.5 and torch.equal(server["best"]["head.bias"], always(1)["head.bias"])
    method.server_event(ServerEvent("round", server, 0, always(0), {}, model))  # none right: not kept
    assert server["best_score"] == 0.5 and server["best"]["head.bias"][1] == 100
    method.server_event(ServerEvent("task_end", server, 0, params))
    assert server["old_model"]["head.bias"][1] == 100 and server["round_in_task"] == 0
    assert server["best_score"] == -math.inf


def test_the_ablation_takes_the_tasks_final_global_model():
    method, model, params = make(proxy=False)
    server: dict = {}
    method.server_event(ServerEvent("round", server, 0, params, {}, model))
    later = {k: v + 1 for k, v in params.items()}
    method.server_event(ServerEvent("round", server, 0, later, {}, model))
    method.server_event(ServerEvent("task_end", server, 0, params))
    assert torch.equal(server["old_model"]["head.bias"], later["head.bias"]) and "monitor_x" not in server
