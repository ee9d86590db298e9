"""PILoRA (Guo et al. 2024): each piece against a transcription of the official code's lines (Ghy0501/PILoRA,
PILoRA-cifar: VLT.py's ``_LoRA_qkv_timm`` and ``compute_distance``, CPN.py's ``DCE``, update.py's L1 and
orthogonality terms, utils.py's ``compute_weight``; fed-mammoth's ``_models/pilora.py`` forward over the tasks so
far), the step moving only the task's factors and centres, the server's re-weighted centres, batched equal to
sequential, and the refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from scipy.spatial.distance import cdist

from cfl.methods.pilora import reweighted_center
from cfl.pretrained.prototype_head import PrototypeHead, prototype_distances
from cfl.pretrained.task_lora import TaskLoRALinear
from tests.helpers import tiny_vit_runner
from tests.run_pairs import assert_batched_equals_sequential


def _official_qkv(qkv: torch.nn.Linear, a_q, b_q, a_v, b_v, upto: int, x: torch.Tensor) -> torch.Tensor:
    """fed-mammoth's ``_LoRA_qkv_timm.forward``: the tasks before ``lora_id`` and ``lora_id`` itself."""
    out = qkv(x)
    dim = qkv.in_features
    for i in range(upto + 1):
        out[:, :, :dim] += F.linear(F.linear(x, a_q[i]), b_q[i])
        out[:, :, -dim:] += F.linear(F.linear(x, a_v[i]), b_v[i])
    return out


def test_task_lora_forward_is_the_official_sum_over_tasks_and_the_merged_weight():
    torch.manual_seed(0)
    dim, rank, tasks = 6, 2, 3
    base = torch.nn.Linear(dim, 3 * dim)
    layer = TaskLoRALinear(base, rank, float(rank), tasks, "qv")  # alpha = rank: scale 1, the official
    with torch.no_grad():
        layer.lora_b[:2].normal_()  # tasks 0 and 1 trained, task 2's B still zero
    x = torch.randn(2, 4, dim)
    a, b = layer.lora_a.detach(), layer.lora_b.detach()
    official = _official_qkv(base, a[:, 0], b[:, 0], a[:, 1], b[:, 1], 1, x)
    with torch.no_grad():
        assert torch.allclose(layer(x), official, atol=1e-6)
        assert torch.allclose(layer(x), F.linear(x, layer.merged(), base.bias), atol=1e-5)
        assert torch.equal(layer(x)[..., dim:2 * dim], base(x)[..., dim:2 * dim])  # the keys are not adapted


def test_task_lora_starts_as_the_pretrained_layer_with_nn_linear_a():
    torch.manual_seed(1)
    base = torch.nn.Linear(5, 15)
    layer = TaskLoRALinear(base, 3, 3.0, 2, "qkv")
    x = torch.randn(4, 5)
    with torch.no_grad():
        assert torch.equal(layer(x), base(x))  # B zero
    bound = 1 / math.sqrt(5)  # kaiming_uniform(a=sqrt 5): U(-1/sqrt(in), 1/sqrt(in)), nn.Linear's
    assert layer.lora_a.abs().max() <= bound and layer.lora_a.std() > bound / 3


def test_prototype_distances_by_hand_and_as_the_official_compute_distance():
    f = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    c = torch.tensor([[1.0, 2.0], [4.0, 6.0]])
    d = prototype_distances(f, c)
    # |f0 - c1|^2 = 9 + 16 = 25, over D = 2: sqrt(12.5); |f1 - c1|^2 = 52: sqrt(26); |f1 - c0|^2 = 5: sqrt(2.5)
    expected = torch.tensor([[1e-6, math.sqrt(12.5)], [math.sqrt(2.5), math.sqrt(26)]])
    assert torch.allclose(d, expected, atol=1e-6)
    gen = torch.Generator().manual_seed(2)
    f, c = torch.randn(5, 8, generator=gen), torch.randn(3, 8, generator=gen)
    centers = c.T  # the official (D, K) layout
    official = ((f.pow(2).sum(1, keepdim=True) + centers.pow(2).sum(0, keepdim=True) - 2 * f @ centers)
                / float(f.shape[1])).sqrt()
    assert torch.allclose(d := prototype_distances(f, c), official, atol=1e-6)
    head = PrototypeHead(8, 3, 1, multi=False)
    with torch.no_grad():
        head.centers.copy_(c)
        assert torch.allclose(head(f, torch.zeros(5, dtype=torch.long)), -d)


def test_one_head_per_task_reads_the_samples_task_centres():
    torch.manual_seed(3)
    head = PrototypeHead(4, 2, 3, multi=True)
    f, task = torch.randn(3, 4), torch.tensor([2, 0, 2])
    with torch.no_grad():
        out = head(f, task)
        for b in range(3):
            assert torch.allclose(out[b], -prototype_distances(f[b:b + 1], head.centers[task[b]])[0])


# ---- the loss through the method, against the official lines ----

def _ctx(params, logits, y, task):
    from cfl.methods.training_hooks import LossContext

    n = len(y)
    return LossContext("task", params, torch.zeros(n, 1), task, torch.ones(n), {}, {}, None, logits, y, None)


def _method(tmp_path, **method):
    from cfl.methods import METHODS

    run = runner(config(tmp_path, method={"name": "pilora", **method}))
    return METHODS.get("pilora"), run


def test_the_loss_is_the_official_dce_prototype_l1_and_orthogonality_terms(tmp_path):
    pytest.importorskip("timm")
    _, run = _method(tmp_path)
    method = run.methods[0]
    gen = torch.Generator().manual_seed(4)
    dist = torch.rand(6, 4, generator=gen) + 0.1
    y = torch.tensor([0, 1, 2, 3, 1, 0])
    task = torch.ones(6, dtype=torch.long)
    params = {k: v.detach().clone() for k, v in run.params.items()}
    layer = method.layers[0]
    a = torch.randn(params[f"{layer}.lora_a"].shape, generator=gen)
    params[f"{layer}.lora_a"] = a
    part_task = method.loss(_ctx(params, -dist, y, task)).task.mean()
    # CPN.DCE: F.cross_entropy(-distance / T, labels) + 0.001 * mean(diag(index_select(distance, 1, labels)))
    official_dce = F.cross_entropy(-dist / 1.0, y) + 0.001 * torch.diagonal(torch.index_select(dist, 1, y)).mean()
    assert torch.allclose(part_task, official_dce, atol=1e-6)
    ctx = _ctx(params, -dist, y, task)
    ctx.part = "extra"
    extra = method.loss(ctx).extra
    # update.py: 0.01 * (norm(A_q,t, p=1) + norm(A_v,t, p=1)) + 0.5 * sum over earlier s of sum|A_s A_t^T|
    l1 = torch.norm(a[1, 0], p=1) + torch.norm(a[1, 1], p=1)
    ort = torch.abs(torch.mm(a[0, 0], a[1, 0].T)).sum() + torch.abs(torch.mm(a[0, 1], a[1, 1].T)).sum()
    assert torch.allclose(extra, (0.01 * l1 + 0.5 * ort).expand(6), rtol=1e-5)
    ctx.task = torch.zeros(6, dtype=torch.long)  # the first task: L1 only, no earlier task
    assert torch.allclose(method.loss(ctx).extra, (0.01 * (torch.norm(a[0, 0], p=1) + torch.norm(a[0, 1], p=1)))
                          .expand(6), rtol=1e-5)


def test_the_step_moves_the_tasks_factors_and_its_classes_centres_only(tmp_path):
    pytest.importorskip("timm")
    from cfl.methods.hook_types import Step

    _, run = _method(tmp_path)
    method = run.methods[0]
    grads = {k: torch.ones_like(v) for k, v in run.params.items()}
    step = Step(params=run.params, grads=grads, x=torch.zeros(2, 1), y=torch.zeros(2, dtype=torch.long),
                task=torch.ones(2, dtype=torch.long), weight=torch.ones(2), samples=None, global_params=run.params,
                server={}, state={}, carry={}, lr=0.1, index=0, gradient=dict)
    out = method.step_gradient(step)
    for k, g in out.items():
        if k.endswith((".lora_a", ".lora_b")):
            assert g[1].eq(1).all() and g[0].eq(0).all(), k
    task1 = list(run.stream.tasks[1].classes)
    centre = out["head.centers"]
    assert centre[task1].eq(1).all()
    assert centre[[c for c in range(centre.shape[0]) if c not in task1]].eq(0).all()


# ---- the server's re-weighting ----

def _official_compute_weight(centers: list[np.ndarray], features: list[np.ndarray]) -> torch.Tensor:
    """utils.py ``compute_weight`` for one class: cdist, summed, reciprocal, min-max, softmax(/ 0.2)."""
    distances = cdist(np.array(centers), features, metric="euclidean")
    total = [item for sub in np.sum(distances, axis=1, keepdims=True).tolist() for item in sub]
    reciprocal = [1 / v for v in total]
    lo, hi = np.min(reciprocal), np.max(reciprocal)
    return F.softmax(torch.tensor([(v - lo) / (hi - lo) for v in reciprocal]) / 0.2, dim=0)


def test_the_reweighted_centre_is_the_official_compute_weights_average():
    gen = torch.Generator().manual_seed(5)
    centers = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    means = [torch.randn(6, generator=gen, dtype=torch.float64) for _ in range(3)]  # three clients hold the class
    weights = _official_compute_weight([c.numpy() for c in centers], [m.numpy() for m in means])
    expected = (weights.double().unsqueeze(1) * centers).sum(0)
    assert torch.allclose(reweighted_center(centers, means, 0.2), expected, atol=1e-9)
    # a centre on the class mean weighs most (fed-mammoth's eps: no division by zero); one client: itself
    near = reweighted_center(torch.stack([means[0], means[0] + 10]), [means[0]], 0.2)
    assert torch.allclose(near, means[0] + 10 * math.exp(0) / (math.exp(0) + math.exp(5)), atol=1e-12)
    assert torch.allclose(reweighted_center(centers[:1], means, 0.2), centers[0])
    assert reweighted_center(centers, [], 0.2) is None


# ---- through the engine: a random ViT-Ti/16 at 16 px (one patch) ----

MODEL = {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "lora", "lora_targets": "qv",
         "lora_layers": 1, "lora_tasks": "per-task", "classifier": "prototype"}


def config(tmp_path: Path, **extra: object):
    from cfl.validation import from_dict

    data = {"stream": {"name": "split-digits", "num_tasks": 2}, "model": MODEL, "method": {"name": "pilora"},
            "num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.01,
            "optimizer": {"name": "adam"}, "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"}}
    data.update(extra)
    return from_dict(data)


def runner(cfg):
    return tiny_vit_runner(cfg)


def test_a_round_trains_task_zero_and_sets_the_reweighted_centres(tmp_path):
    pytest.importorskip("timm")
    run = runner(config(tmp_path))
    start = {k: v.clone() for k, v in run.params.items()}
    layer = [k for k in start if k.endswith(".lora_b")]
    assert layer == ["vit.blocks.0.attn.qkv.lora_b"]  # the first block only
    run.run_round(0, 0)
    b = run.params[layer[0]]
    assert not torch.equal(b[0], start[layer[0]][0]) and b[1].eq(0).all()  # task 1's B untouched
    task0 = list(run.stream.tasks[0].classes)
    later = [c for c in range(start["head.centers"].shape[0]) if c not in task0]
    assert torch.equal(run.params["head.centers"][later], start["head.centers"][later])
    assert not torch.equal(run.params["head.centers"][task0], start["head.centers"][task0])
    mean = runner(config(tmp_path, method={"name": "pilora", "reweight": "mean"}))
    mean.run_round(0, 0)
    assert not torch.allclose(mean.params["head.centers"][task0], run.params["head.centers"][task0])
    assert torch.allclose(mean.params[layer[0]], run.params[layer[0]])  # the factors: FedAvg both ways


def test_batched_equals_sequential(tmp_path):
    pytest.importorskip("timm")
    runs = [runner(config(tmp_path, client_execution=e)) for e in ("batched", "sequential")]
    for r in runs:
        r.run()
    assert_batched_equals_sequential(*runs)


@pytest.mark.parametrize(("extra", "words"), [
    ({"weight_decay": 0.1}, "set weight_decay: 0"),
    ({"optimizer": {"name": "adam", "state": "kept"}}, "set optimizer.state: fresh"),
    ({"model": {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "lora"}},
     "set model.lora_tasks: per-task and model.classifier: prototype"),
    ({"model": {**MODEL, "lora_layers": 13}}, "model.lora_layers 13 exceeds vit-ti16's 12 blocks"),
    ({"model": {**MODEL, "train": "head", "lora_targets": "qkv", "lora_layers": 0, "lora_tasks": "shared"},
      "method": {"name": "fedncm"}}, "model.classifier is read only under another model.train"),
    ({"method": {"name": "lorm"}}, "method lorm merges one LoRA pair"),
    ({"method": {"name": "lora"}}, "method lora trains every factor at every task"),
])
def test_refusals(tmp_path, extra, words):
    from cfl.config.keys import ConfigError

    with pytest.raises(ConfigError, match=words):
        config(tmp_path, **extra)
