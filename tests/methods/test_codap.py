"""CODA-P's component weighting and orthogonality penalty by hand on a tiny case, and its model end to end."""

from __future__ import annotations

import math

import pytest
import torch

from cfl.methods.training_hooks import LossContext
from cfl.pretrained.coda_prompt import ComponentPrompt, component_weights, orthogonality


def test_component_weights_are_the_cosine_of_the_attended_query_and_each_key():
    query = torch.tensor([[1.0, 2.0]])
    attention = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    keys = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    # m=0: q*A = (1, 0), cos with (1, 0) = 1; m=1: q*A = (1, 2), cos with (0, 3) = 2 / sqrt(5)
    alpha = component_weights(query, keys, attention)
    assert torch.allclose(alpha, torch.tensor([[1.0, 2 / math.sqrt(5)]]))
    pool = ComponentPrompt(2, 1, 2)
    with torch.no_grad():
        pool.keys.copy_(keys)
        pool.attention.copy_(attention)
        pool.prompts.copy_(torch.tensor([[[1.0, 1.0]], [[0.0, 5.0]]]))
    # the prompt: 1 * (1, 1) + 2/sqrt(5) * (0, 5)
    assert torch.allclose(pool(query), torch.tensor([[[1.0, 1.0 + 10 / math.sqrt(5)]]]))


def test_gradients_reach_keys_and_attention_through_the_weights():
    pool = ComponentPrompt(3, 2, 4)
    pool(torch.randn(5, 4)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (pool.keys, pool.attention, pool.prompts))


def test_orthogonality_penalty_by_hand_and_orthonormal_start():
    b = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    # B B^T = [[2, 2], [2, 4]]; minus I: [[1, 2], [2, 3]]; squares 1, 4, 4, 9: mean 4.5
    assert orthogonality(b).item() == pytest.approx(4.5)
    pool = ComponentPrompt(3, 2, 4)
    assert all(orthogonality(p).item() < 1e-10 for p in (pool.keys, pool.attention, pool.prompts))


def test_codap_model_trains_components_keys_attention_and_head_only():
    pytest.importorskip("timm")
    import timm

    from cfl.pretrained.adapted import AdaptedViT

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=16)
    model = AdaptedViT(vit, "components", 4, 2, False, 16, "bicubic", prompt=(4, 2, 0))
    assert sorted(n for n, _ in model.named_parameters()) == ["head.bias", "head.weight", "prompt.attention",
                                                              "prompt.keys", "prompt.prompts"]
    assert model(torch.randn(3, 3, 8, 8), torch.zeros(3, dtype=torch.long)).shape == (3, 4)
    assert "prompts, keys and attention" in model.summary()


def test_components_without_codap_and_codap_without_components_are_refused():
    from types import SimpleNamespace

    from cfl.config.schema import ConfigError
    from cfl.methods import METHODS
    from cfl.pretrained.loaded import check_method_train

    def cfg(train, method):
        return SimpleNamespace(model=SimpleNamespace(train=train), method={"name": method}, plugins=[])

    with pytest.raises(ConfigError, match="components trains CODA-P.s prompt components; use method codap"):
        check_method_train(cfg("components", "fedavg"), {n: METHODS[n].requires.model_train for n in ("fedavg",)})
    with pytest.raises(ConfigError, match="method codap needs model.train: components"):
        check_method_train(cfg("prompts", "codap"), {n: METHODS[n].requires.model_train for n in ("codap",)})
    check_method_train(cfg("components", "codap"), {n: METHODS[n].requires.model_train for n in ("codap",)})


def test_the_penalty_counts_the_prompt_components_with_keys_and_attention():
    from types import SimpleNamespace

    from cfl.methods.codap import CodaP, CodaPHyperparams

    eye = torch.eye(2)
    prompts = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]]])  # flattened: two equal rows
    params = {"prompt.keys": eye, "prompt.attention": eye, "prompt.prompts": prompts}
    method = CodaP(CodaPHyperparams(ortho=0.5, start="at-once"), SimpleNamespace(model=SimpleNamespace(
        prompt=SimpleNamespace(layers=0))))
    # every component at once (cfl's earlier form): keys and attention orthonormal: 0; the prompts'
    # P P^T = [[1, 1], [1, 1]]: mean((P P^T - I)^2) = 2 / 4
    loss = method.loss(LossContext("extra", params, torch.zeros(3, 1), torch.zeros(3, dtype=torch.long),
                                   torch.ones(len(torch.zeros(3, 1))), {}, {})).extra
    assert loss.tolist() == pytest.approx([0.25] * 3)


def _config(tmp_path, method: str | dict = "codap", **extra):
    from cfl.validation import from_dict

    model = {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "components", "prompt_pool": 4,
             "prompt_length": 2, "component_layers": 2}
    method = {"name": method} if isinstance(method, str) else method
    return from_dict({"stream": {"name": "split-digits", "num_tasks": 2}, "model": model, "method": method,
                      "num_clients": 4, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 8, "lr": 0.01,
                      "weight_decay": 0.0, "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"},
                      **extra})


def _rows(params, k, rows):
    return params[f"prompt.{k}"][rows]


COMPONENTS = ("prompts", "keys", "attention")


def test_an_engine_run_enters_each_tasks_slice_at_its_start_and_freezes_it_after(tmp_path):
    pytest.importorskip("timm")
    from cfl.pretrained.component_slices import layer_rows
    from tests.run_pairs import tiny_pretrained_runner

    run = tiny_pretrained_runner(_config(tmp_path))
    start = run.params
    for k in COMPONENTS:  # task 1's components are zero until its task; task 0's are Gram-Schmidt's unit rows
        assert torch.equal(_rows(start, k, slice(2, 4)), torch.zeros_like(_rows(start, k, slice(2, 4))))
        for rows in layer_rows(start[f"prompt.{k}"], True):
            assert torch.allclose(rows[:2] @ rows[:2].T, torch.eye(2), atol=1e-5)
    run.run_round(0, 0)
    run.run_round(0, 1)
    trained = run.params
    for k in COMPONENTS:
        assert not torch.equal(_rows(trained, k, slice(0, 2)), _rows(start, k, slice(0, 2)))
        assert torch.equal(_rows(trained, k, slice(2, 4)), _rows(start, k, slice(2, 4)))  # zero rows stay zero
    run.task_end(0)
    entered = run.params
    for k in COMPONENTS:
        assert torch.equal(_rows(entered, k, slice(0, 2)), _rows(trained, k, slice(0, 2)))
        for rows in layer_rows(entered[f"prompt.{k}"], True):
            assert torch.allclose(rows[2:].norm(dim=1), torch.ones(2))
            assert float((rows[2:] @ rows[:2].T).abs().max()) < 0.5  # near orthogonal to the trained rows
    run.run_round(1, 0)
    for k in COMPONENTS:  # task 0's slice frozen through task 1
        assert torch.equal(_rows(run.params, k, slice(0, 2)), _rows(trained, k, slice(0, 2)))
        assert not torch.equal(_rows(run.params, k, slice(2, 4)), _rows(entered, k, slice(2, 4)))


@pytest.mark.parametrize("method", ["codap", {"name": "fedcprompt", "start": "orthogonal"}])
def test_batched_equals_sequential_under_the_per_task_start(tmp_path, method):
    pytest.importorskip("timm")
    from tests.run_pairs import assert_batched_equals_sequential, tiny_pretrained_runner

    runs = [tiny_pretrained_runner(_config(tmp_path, method, client_execution=e)) for e in ("batched", "sequential")]
    for r in runs:
        r.run()
    assert_batched_equals_sequential(*runs)


@pytest.mark.parametrize("method", ["codap", {"name": "fedcprompt", "start": "orthogonal"}])
def test_resume_across_the_task_end_is_bit_identical(tmp_path, monkeypatch, method):
    pytest.importorskip("timm")
    from tests.run_pairs import assert_resumes_bit_identically

    assert_resumes_bit_identically(_config(tmp_path, method, checkpoint_every=1, num_clients=3), tmp_path,
                                   monkeypatch, after_round=1)


def test_fedcprompts_slices_enter_from_the_first_orthonormal_draw(tmp_path):
    pytest.importorskip("timm")
    from tests.run_pairs import tiny_pretrained_runner

    run = tiny_pretrained_runner(_config(tmp_path, {"name": "fedcprompt", "start": "orthogonal"}))
    waiting = run.states[0].server["waiting_components"]
    for k in COMPONENTS:
        assert torch.equal(_rows(run.params, k, slice(0, 2)), waiting[f"prompt.{k}"][:2])
    run.run_round(0, 0)
    run.task_end(0)
    for k in COMPONENTS:
        assert torch.equal(_rows(run.params, k, slice(2, 4)), waiting[f"prompt.{k}"][2:])


@pytest.mark.parametrize(("extra", "message"), [
    ({"schedule": {"name": "staggered"}}, r"runs under schedule synchronous only: each task's components enter "
                                             r".*, or set method.start: at-once"),
    ({"model": {"prompt_pool": 5}}, r"prompt_pool 5 would leave 1 unused"),
    ({"model": {"prompt_length": 3}}, r"prompt_length 3 is odd"),
    ({"model": {"component_layers": 13}}, r"component_layers 13 exceeds vit-ti16's 12 blocks"),
])
def test_refusals(tmp_path, extra, message):
    from cfl.config.schema import ConfigError

    model = {"prompt_pool": 4, "prompt_length": 2, "component_layers": 2, **extra.pop("model", {})}
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, model={"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "components",
                                 **model}, **extra)


def test_the_at_once_start_runs_under_a_staggered_schedule(tmp_path):
    cfg = _config(tmp_path, method={"name": "codap", "start": "at-once"}, schedule={"name": "staggered"})
    assert cfg.method["start"] == "at-once"
