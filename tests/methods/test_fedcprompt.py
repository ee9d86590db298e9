"""Fed-CPrompt's contrastive continual loss and task slices by hand on tiny tensors, and its method end to end."""

from __future__ import annotations

import pytest
import torch

from cfl.methods.server_hooks import ServerEvent
from cfl.methods.training_hooks import ClientEndContext, LossContext
from cfl.pretrained.contrastive_continual import contrastive_continual_loss, task_rows
from tests.run_pairs import assert_batched_equals_sequential, assert_resumes_bit_identically, tiny_pretrained_runner


def test_c2l_is_the_scaled_triplet_on_each_sample():
    anchor = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    positive = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    negative = torch.tensor([[3.0, 0.0], [0.0, 0.5]])
    # sample 0: |a-p|^2 = 1, |a-n|^2 = 4: max(0, 2 * 1 - 0.5 * 4 + 0.25) = 0.25
    # sample 1: |a-p|^2 = 0, |a-n|^2 = 0.25: max(0, 0 - 0.125 + 0.25) = 0.125
    loss = contrastive_continual_loss(anchor, positive, negative, margin=0.25, pull=2.0, push=0.5)
    assert torch.allclose(loss, torch.tensor([0.25, 0.125]))
    # a far negative: the hinge is 0 (sample 0: 2 - 0.5 * 4 * 4 + 0.25 < 0)
    far = contrastive_continual_loss(anchor, positive, 2 * negative, margin=0.25, pull=2.0, push=0.5)
    assert far[0].item() == 0.0
    # the first task, no negative: the pull alone, 2 * |a-p|^2
    assert torch.allclose(contrastive_continual_loss(anchor, positive, None, 0.25, 2.0, 0.5), torch.tensor([2.0, 0.0]))


def test_c2l_gradient_pulls_towards_the_positive_and_pushes_from_the_negative():
    anchor = torch.tensor([[1.0, 0.0]], requires_grad=True)
    contrastive_continual_loss(anchor, torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]]), 1.0, 1.0, 1.0).sum() \
        .backward()
    # d/da (|a-p|^2 - |a-n|^2) = 2 (a-p) - 2 (a-n) = 2 (n - p) = (2, 2)
    assert torch.equal(anchor.grad, torch.tensor([[2.0, 2.0]]))


def test_task_rows_split_the_pool_into_one_slice_per_task():
    assert task_rows(6, 3).tolist() == [0, 0, 1, 1, 2, 2]
    assert task_rows(5, 2).tolist() == [0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="3 prompt components cannot give each of 4 tasks"):
        task_rows(3, 4)


def _method(pool: int = 4, tasks: int = 2):
    pytest.importorskip("timm")
    import timm

    from cfl.methods.base import RunInfo
    from cfl.methods.fedcprompt import FedCPrompt, FedCPromptHyperparams
    from cfl.pretrained.adapted import AdaptedViT

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=16)
    model = AdaptedViT(vit, "components", 4, tasks, False, 16, "bicubic", prompt=(pool, 2, 0))
    info = RunInfo(num_tasks=tasks, scenario="class", num_clients=2, clients_per_round=2, seed=0, model=model)
    return FedCPrompt(FedCPromptHyperparams(), info), model


def test_step_gradient_moves_only_the_current_tasks_components():
    from types import SimpleNamespace

    method, model = _method()
    grads = {k: torch.ones_like(v) for k, v in model.named_parameters()}
    out = method.step_gradient(SimpleNamespace(grads=grads, task=torch.tensor([1, 1, 1])))
    for k in ("prompt.prompts", "prompt.keys", "prompt.attention"):  # rows 2, 3 are task 1's
        assert out[k][:2].abs().sum() == 0 and torch.equal(out[k][2:], grads[k][2:])
    assert torch.equal(out["head.weight"], grads["head.weight"])


def test_extra_loss_is_the_pull_then_the_triplet_after_a_task_end():
    from cfl.methods.fedcprompt import FedCPromptHyperparams
    from cfl.ops.data_free_clients import logits_and_features
    from cfl.ops.distill import frozen

    method, model = _method()
    method.hparams = FedCPromptHyperparams(reduction="sample")  # a hinge per sample (the default: the batch sum)
    params = dict(model.named_parameters())
    server: dict = {}
    assert method.server_event(ServerEvent("start", server, 0, params)) is None  # at-once: every slice in place
    x, task = torch.randn(3, 3, 8, 8), torch.zeros(3, dtype=torch.long)
    # at the global model itself: no pull, no previous task: 0
    assert torch.allclose(method.loss(LossContext("extra", params, x, task, torch.ones(len(x)), server, {})).extra,
                          torch.zeros(3), atol=1e-6)
    moved = {k: v + 0.1 if k == "prompt.prompts" else v for k, v in params.items()}
    z, z_glob = (logits_and_features(model, p, x, task)[1] for p in (moved, params))
    pull = 1000.0 * (z - z_glob).pow(2).sum(-1)
    assert torch.allclose(method.loss(LossContext("extra", moved, x, task, torch.ones(len(x)), server, {})).extra, pull)
    state: dict = {}
    method.client_end(ClientEndContext("task_end", model, frozen(moved), None, state, server, torch.Generator()))
    # the negative is the moved model itself: max(0, pull - 0 + 1)
    assert torch.allclose(method.loss(LossContext("extra", moved, x, task, torch.ones(len(x)), server, state)).extra,
                          pull + 1.0)


def test_fewer_components_than_tasks_and_weight_decay_are_refused():
    from cfl.config.schema import ConfigError
    from cfl.validation import from_dict

    model = {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "components", "prompt_pool": 2}
    base = {"stream": {"name": "split-digits", "num_tasks": 3}, "method": {"name": "fedcprompt"}, "model": model,
            "wandb": {"mode": "disabled"}}
    with pytest.raises(ConfigError, match="model.prompt_pool 2 is fewer than stream.num_tasks 3"):
        from_dict(base)
    with pytest.raises(ConfigError, match="fedcprompt freezes .* set weight_decay: 0"):
        from_dict({**base, "stream": {"name": "split-digits", "num_tasks": 2}, "weight_decay": 0.01})
    with pytest.raises(ConfigError, match="use method codap or fedcprompt"):
        from_dict({**base, "method": {"name": "fedavg"}})


def _config(tmp_path, **extra):
    from cfl.validation import from_dict

    model = {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "components", "prompt_pool": 4,
             "prompt_length": 2}
    return from_dict({"stream": {"name": "split-digits", "num_tasks": 2}, "model": model,
                      "method": {"name": "fedcprompt"}, "num_clients": 4, "clients_per_round": 3,
                      "rounds_per_task": 2, "batch_size": 8, "lr": 0.01, "data_root": str(tmp_path / "data"),
                      "wandb": {"mode": "disabled"}, **extra})


def test_batched_equals_sequential_and_each_task_moves_its_own_slice(tmp_path):
    pytest.importorskip("timm")
    start = tiny_pretrained_runner(_config(tmp_path)).params
    runs = [tiny_pretrained_runner(_config(tmp_path, client_execution=e)) for e in ("batched", "sequential")]
    first = runs[0].run_round(0, 0)  # task 0's first round: rows 0, 1 move, rows 2, 3 (task 1's) do not
    assert torch.equal(runs[0].params["prompt.keys"][2:], start["prompt.keys"][2:])
    assert not torch.equal(runs[0].params["prompt.keys"][:2], start["prompt.keys"][:2])
    # bytes: each of the three clients sends the trainable subset; the global model's copy adds none
    assert first["upload_bytes"] == 3 * runs[0].model_bytes
    assert first["download_bytes"] == 3 * runs[0].model_bytes
    runs[1].run_round(0, 0)
    for r in runs:
        r.run()
    assert_batched_equals_sequential(*runs)


def test_resume_is_bit_identical(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    assert_resumes_bit_identically(_config(tmp_path, checkpoint_every=1, num_clients=3), tmp_path, monkeypatch)


def test_the_official_reduction_is_one_hinge_of_the_batch_sum_by_hand():
    from cfl.pretrained.contrastive_continual import batch_contrastive_continual_loss

    # four samples, 1-d features: |a-p|^2 = 1, 0, 4, 1 and |a-n|^2 = 9, 4, 1, 0; pull 1, push 1, margin 1
    anchor = torch.tensor([[1.0], [0.0], [2.0], [1.0]])
    positive = torch.tensor([[0.0], [0.0], [0.0], [0.0]])
    negative = torch.tensor([[4.0], [2.0], [1.0], [1.0]])
    # per sample: max(0, d + 1) for d = -8, -4, 3, 1: 0, 0, 4, 2; their mean 1.5
    per_sample = contrastive_continual_loss(anchor, positive, negative, 1.0, 1.0, 1.0)
    assert per_sample.tolist() == [0.0, 0.0, 4.0, 2.0] and per_sample.mean().item() == 1.5
    # the official TripletLoss: max(0, sum d + 1) = max(0, -8 + 1) = 0
    ones = torch.ones(4)
    assert batch_contrastive_continual_loss(anchor, positive, negative, 1.0, 1.0, 1.0, ones).item() == 0.0
    # a padded sample (weight 0) counts nothing: without the first, max(0, -4 + 3 + 1 + 1) = 1
    assert batch_contrastive_continual_loss(anchor, positive, negative, 1.0, 1.0, 1.0,
                                            torch.tensor([0.0, 1.0, 1.0, 1.0])).item() == 1.0
    # the first task (positive_loss): the pull summed over the batch, 1 + 0 + 4 + 1, not averaged (1.5)
    assert batch_contrastive_continual_loss(anchor, positive, None, 1.0, 1.0, 1.0, ones).item() == 6.0


def test_the_method_defaults_to_the_batch_sum_and_offers_the_per_sample_mean():
    from cfl.methods.fedcprompt import FedCPromptHyperparams
    from cfl.ops.data_free_clients import logits_and_features

    assert FedCPromptHyperparams().reduction == "batch"
    method, model = _method()
    params = dict(model.named_parameters())
    server: dict = {}
    assert method.server_event(ServerEvent("start", server, 0, params)) is None  # at-once: every slice in place
    x, task = torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)
    moved = {k: v + 0.1 if k == "prompt.prompts" else v for k, v in params.items()}
    z, z_glob = (logits_and_features(model, p, x, task)[1] for p in (moved, params))
    pull = 1000.0 * (z - z_glob).pow(2).sum(-1)
    weight = torch.tensor([1.0, 1.0, 1.0, 0.0])
    batch = method.loss(LossContext("extra", moved, x, task, weight, server, {})).extra
    assert torch.allclose(batch, pull[:3].sum().expand(4))
    method.hparams = FedCPromptHyperparams(reduction="sample")
    assert torch.allclose(method.loss(LossContext("extra", moved, x, task, weight, server, {})).extra, pull)
