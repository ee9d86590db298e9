"""Powder (cfl/methods/powder.py, cfl/pretrained/task_prompts.py and task_correlation.py,
cfl/ops/not_true_distillation.py): the composed prompt against a transcription of the official code's loop
(piaohongming/Powder ae7beeb, ``src/models_Cprompt/vit_coda_p.py`` L2381-2460), the task and class correlation
and the not-true distillation on hand-computed cases, the step's row mask, and the server's row replacement and
correlation."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from cfl.methods.powder import Powder, PowderHyperparams
from cfl.methods.server_hooks import ServerEvent
from cfl.ops.not_true_distillation import batch_softmax_weights, not_true_distillation, not_true_logits
from cfl.pretrained.task_correlation import class_weights, similarity, task_mixing, task_selection
from cfl.pretrained.task_prompts import TaskComponents, component_scores


def _official_prompt(q, keys, attention, prompts, weight, trained, g, top_k, layer):
    """The official composition of one input's prompt at one layer (its loop, in this test's words): the top-k of
    ``weight[g][trained]`` (k clipped to the trained count), each selected task ``i``'s components mixed by
    ``weight[i]`` over the trained tasks, concatenated, scored by ``cos(q * A, K)``, ``sum a P`` divided by k."""
    k = min(top_k, len(trained))
    _, idx = weight[g][trained].topk(k)
    idx = [trained[i] for i in idx]
    ks, as_, ps = [], [], []
    for i in idx:
        w = weight[i][trained]
        ks.append(sum(w[j] * keys[t, layer] for j, t in enumerate(trained)))
        as_.append(sum(w[j] * attention[t, layer] for j, t in enumerate(trained)))
        ps.append(sum(w[j] * prompts[t, layer] for j, t in enumerate(trained)))
    k_all, a_all, p_all = torch.cat(ks), torch.cat(as_), torch.cat(ps) / k  # (k C, D), (k C, D), (k C, len, D)
    a = (F.normalize(q * a_all, dim=-1) * F.normalize(k_all, dim=-1)).sum(-1)  # (k C,)
    return torch.einsum("c,cpd->pd", a, p_all)


def _module(tasks=4, components=2, length=3, width=5, blocks=2, seed=0):
    torch.manual_seed(seed)
    return TaskComponents(tasks, components, length, width, blocks)


def test_the_composed_prompt_equals_the_official_loop():
    m = _module()
    torch.manual_seed(1)
    w = torch.rand(4, 4)
    trained = [0, 1, 3]  # task 2 not trained: its column is 0 and it is never selected
    w[:, 2] = 0
    w = w / w.sum(1, keepdim=True)
    has = torch.tensor([True, True, False, True])
    with torch.no_grad():
        m.mixing.copy_(torch.where(has.unsqueeze(1), w, torch.eye(4)))
        m.selection.copy_(task_selection(m.mixing, has, 2))
    q = torch.randn(3, 5)
    task = torch.tensor([0, 3, 1])
    out = m(q, task)
    assert out.shape == (3, 2, 3, 5)
    for n in range(3):
        for layer in range(2):
            expected = _official_prompt(q[n], m.keys.detach(), m.attention.detach(), m.prompts.detach(),
                                        m.mixing.detach(), trained, int(task[n]), 2, layer)
            torch.testing.assert_close(out[n, layer].detach(), expected, rtol=1e-5, atol=1e-6)


def test_at_the_start_each_task_uses_its_own_components_alone():
    m = _module(tasks=3, components=2, length=1, width=4, blocks=1)
    q = torch.randn(2, 4)
    out = m(q, torch.tensor([1, 2]))
    for n, t in enumerate((1, 2)):
        a = component_scores(q[n:n + 1], m.keys[t:t + 1], m.attention[t:t + 1])[0, 0, 0]  # (C,)
        torch.testing.assert_close(out[n, 0], torch.einsum("c,cpd->pd", a, m.prompts[t, 0]).detach())


def test_rows_start_orthonormal_over_every_task_and_component():
    m = _module(tasks=3, components=2, width=8, blocks=2)
    for layer in range(2):
        k = m.keys[:, layer].reshape(6, 8).detach()
        torch.testing.assert_close(k @ k.T, torch.eye(6), atol=1e-5, rtol=0)


def test_a_gradient_reaches_the_other_tasks_rows_only_through_the_mixing_and_the_step_keeps_the_task_row():
    """The official code detaches the other tasks' rows; cfl's step zeroes their gradient: the task row's
    gradient is the same either way."""
    m = _module(tasks=3, components=2, length=2, width=4, blocks=1)
    with torch.no_grad():
        m.mixing.copy_(torch.tensor([[0.5, 0.5, 0.0], [0.3, 0.7, 0.0], [0.0, 0.0, 1.0]]))
        m.selection.copy_(torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    q = torch.randn(2, 4)
    task = torch.tensor([1, 1])
    m(q, task).square().sum().backward()
    full = m.keys.grad[1].clone()
    # the official form: row 0 detached
    m2 = _module(tasks=3, components=2, length=2, width=4, blocks=1)
    m2.load_state_dict(m.state_dict())
    keys = torch.cat([m2.keys[:1].detach(), m2.keys[1:]])
    mixed_k = torch.einsum("ij,jlcd->ilcd", m2.mixing.detach(), keys)
    mixed_a = torch.einsum("ij,jlcd->ilcd", m2.mixing.detach(), torch.cat([m2.attention[:1].detach(),
                                                                         m2.attention[1:]]))
    mixed_p = torch.einsum("ij,jlcpd->ilcpd", m2.mixing.detach(), torch.cat([m2.prompts[:1].detach(),
                                                                           m2.prompts[1:]]))
    chosen = m2.selection.detach()[task] / 2
    out = torch.einsum("nltc,nt,tlcpd->nlpd", component_scores(q, mixed_k, mixed_a), chosen, mixed_p)
    out.square().sum().backward()
    torch.testing.assert_close(full, m2.keys.grad[1])
    assert m2.keys.grad[0].abs().sum() == 0 and m.keys.grad[0].abs().sum() > 0


def test_similarity_restricts_both_descriptors_to_their_common_tasks():
    desc = torch.zeros(2, 1, 3, 1)
    desc[0, 0, :, 0] = torch.tensor([1.0, 2.0, 5.0])
    desc[1, 0, :, 0] = torch.tensor([2.0, 1.0, 0.0])
    trained = torch.tensor([[True, True, True], [True, True, False]])
    s = similarity(desc, trained)
    expected = (1 * 2 + 2 * 1) / (math.sqrt(5) * math.sqrt(5))  # task 2 dropped from both
    assert s[0, 1].item() == pytest.approx(expected) and s[1, 0].item() == pytest.approx(expected)
    assert s[0, 0].item() == pytest.approx(1.0)


def test_the_mixing_is_the_similarity_to_the_power_divided_by_its_row_sum():
    desc = torch.zeros(3, 2, 3, 1)
    desc[0, :, :, 0] = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    desc[1, :, :, 0] = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    trained = torch.tensor([[True, True, False], [True, True, False], [False, False, False]])
    has = torch.tensor([True, True, False])
    w = task_mixing(desc, trained, has, 2)
    s = (1 / math.sqrt(2) + 1 / math.sqrt(2)) / 2  # per block cosines 1/sqrt2 and 1/sqrt2, averaged
    assert w[0].tolist() == pytest.approx([1 / (1 + s**2), s**2 / (1 + s**2), 0.0])
    assert w[2].tolist() == [0.0, 0.0, 1.0]  # no descriptor: its own components only


def test_the_selection_takes_the_top_k_among_trained_tasks_clipped_to_their_count():
    mixing = torch.tensor([[0.5, 0.2, 0.3, 0.0], [0.1, 0.6, 0.3, 0.0], [0.2, 0.2, 0.6, 0.0], [0, 0, 0, 1.0]])
    has = torch.tensor([True, True, True, False])
    sel = task_selection(mixing, has, 2)
    assert sel.tolist() == [[1, 0, 1, 0], [0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 1]]  # a tie: the lower task id
    assert task_selection(mixing, has, 5)[0].tolist() == [1, 1, 1, 0]


def test_class_weights_zero_the_other_classes_of_the_same_task_and_keep_the_row_top_k():
    desc = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.6], [0.0, 1.0]]).view(4, 1, 2, 1)
    trained = torch.ones(4, 2, dtype=torch.bool)
    task_of = torch.tensor([0, 0, 1, 1])
    f = class_weights(desc, trained, torch.ones(4, dtype=torch.bool), task_of, 1, 2)
    s = similarity(desc, trained)
    assert f[0, 1] == 0 and f[2, 3] == 0  # same task, another class
    row = torch.tensor([1.0, 0.0, s[0, 2].item(), s[0, 3].item()])
    kept = torch.zeros(4).scatter_(0, row.topk(2).indices, 1.0) * row
    torch.testing.assert_close(f[0], (kept / kept.sum()).float())


def test_not_true_distillation_by_hand():
    student = torch.tensor([[2.0, 0.0, 1.0]])
    teacher = torch.tensor([[0.0, 1.0, 3.0]])
    y = torch.tensor([0])
    assert not_true_logits(student, y).tolist() == [[0.0, 1.0]]
    tau = 2.0
    p = torch.softmax(torch.tensor([1.0, 3.0]) / tau, 0)
    q = torch.softmax(torch.tensor([0.0, 1.0]) / tau, 0)
    expected = tau**2 * (p * (p.log() - q.log())).sum()
    assert not_true_distillation(student, teacher, y, tau).item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_batch_weights_are_a_softmax_over_the_real_samples():
    w = batch_softmax_weights(torch.tensor([0.0, math.log(3.0), 5.0]), torch.tensor([1.0, 1.0, 0.0]))
    assert w.tolist() == pytest.approx([0.25, 0.75, 0.0])
    assert batch_softmax_weights(torch.zeros(2), torch.zeros(2)).tolist() == [0.0, 0.0]


def _powder(tasks=3, classes=2, blocks=1, components=2):
    prompt = SimpleNamespace(tasks=tasks, blocks=blocks, components=components)
    info = SimpleNamespace(scenario="task", model=SimpleNamespace(prompt=prompt), num_classes=classes)
    return Powder(PowderHyperparams(top_k=2, task_power=1, class_power=1), info)


def _params(tasks=3, classes=2, blocks=1, components=2, width=4, length=1):
    torch.manual_seed(0)
    return {"prompt.keys": torch.randn(tasks, blocks, components, width),
            "prompt.attention": torch.randn(tasks, blocks, components, width),
            "prompt.prompts": torch.randn(tasks, blocks, components, length, width),
            "prompt.mixing": torch.eye(tasks), "prompt.selection": torch.eye(tasks),
            "head.weight": torch.randn(tasks, classes, width), "head.bias": torch.randn(tasks, classes)}


def _upload(params, task, started, scale, count=4):
    torch.manual_seed(task + 10 * int(scale))
    rows = {k: params[k][task] + scale for k in ("prompt.keys", "prompt.attention", "prompt.prompts", "head.weight",
                                                 "head.bias")}
    return {"task": task, "started": started, "sum": torch.rand(1 * 3 * 2) * count, "count": count,
            "class_sum": torch.rand(2, 6) * 2, "class_count": torch.tensor([2.0, 2.0]), "rows": rows}


def test_the_server_replaces_each_trained_row_by_its_clients_mean_and_keeps_the_others_bit_for_bit():
    method, params = _powder(), _params()
    server: dict = {}
    method.server_event(ServerEvent("start", server, 0, params))
    uploads = {0: _upload(params, 0, 1, 1.0), 1: _upload(params, 0, 1, 3.0), 2: _upload(params, 2, 1, 1.0)}
    averaged = {k: v + 100 for k, v in params.items()}  # what FedAvg gave: replaced
    change = method.server_event(ServerEvent("round", server, 0, averaged, uploads)).params
    torch.testing.assert_close(change["prompt.keys"][0], params["prompt.keys"][0] + 2.0)  # mean of +1 and +3
    torch.testing.assert_close(change["head.bias"][2], params["head.bias"][2] + 1.0)
    assert torch.equal(change["prompt.keys"][1], params["prompt.keys"][1])  # no client: the start's values
    # tasks 0 and 2 began: W and the selection over them, task 1 its own row
    assert change["prompt.mixing"][1].tolist() == [0.0, 1.0, 0.0]
    assert change["prompt.mixing"][0, 1] == 0 and change["prompt.mixing"][0].sum().item() == pytest.approx(1.0)
    assert change["prompt.selection"][0].tolist() == [1.0, 0.0, 1.0]
    assert torch.equal(server["global"]["prompt.keys"], change["prompt.keys"])
    assert server["class_weight"].shape == (6, 6) and server["class_weight"][2:4].abs().sum() == 0  # task 1: none


def test_the_correlation_is_recomputed_only_at_a_round_where_a_client_began_a_task():
    method, params = _powder(), _params()
    server: dict = {}
    method.server_event(ServerEvent("start", server, 0, params))
    method.server_event(ServerEvent("round", server, 0, params, {0: _upload(params, 0, 1, 1.0),
                                                                 1: _upload(params, 1, 1, 1.0)}))
    before = server["mixing"].clone()
    method.server_event(ServerEvent("round", server, 0, params, {0: _upload(params, 0, 0, 2.0),
                                                                 1: _upload(params, 1, 0, 5.0)}))
    assert torch.equal(server["mixing"], before)  # new descriptors kept, W unchanged until a task begins
    method.server_event(ServerEvent("round", server, 0, params, {0: _upload(params, 2, 1, 1.0),
                                                                 1: _upload(params, 1, 0, 5.0)}))
    assert not torch.equal(server["mixing"], before) and server["has"].tolist() == [True, True, True]


def test_a_step_moves_the_clients_task_rows_only_and_never_the_correlation():
    method, params = _powder(), _params()
    grads = {k: torch.ones_like(v) for k, v in params.items()}
    out = method.step_gradient(SimpleNamespace(grads=grads, task=torch.tensor([1, 1])))
    for k in ("prompt.keys", "prompt.prompts", "head.weight", "head.bias"):
        assert out[k][1].abs().sum() > 0 and out[k][0].abs().sum() == 0 and out[k][2].abs().sum() == 0
    assert out["prompt.mixing"].abs().sum() == 0 and out["prompt.selection"].abs().sum() == 0


def test_powder_is_refused_outside_task_incremental_runs():
    from cfl.config.schema import ConfigError
    from cfl.validation import from_dict
    from tests.conftest import METHOD_CONFIGS

    data = {**METHOD_CONFIGS["powder"], "method": {"name": "powder"}, "wandb": {"mode": "disabled"}}
    data["stream"] = {**data["stream"], "scenario": "class"}
    with pytest.raises(ConfigError, match="task-incremental"):
        from_dict(data)
    with pytest.raises(ConfigError, match="weight_decay"):
        from_dict({**METHOD_CONFIGS["powder"], "method": {"name": "powder"}, "weight_decay": 0.1})
