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
    method = CodaP(CodaPHyperparams(ortho=0.5), SimpleNamespace(model=None))
    # keys and attention orthonormal: 0; the prompts' P P^T = [[1, 1], [1, 1]]: mean((P P^T - I)^2) = 2 / 4
    loss = method.loss(LossContext("extra", params, torch.zeros(3, 1), torch.zeros(3, dtype=torch.long),
                                   torch.ones(len(torch.zeros(3, 1))), {}, {})).extra
    assert loss.tolist() == pytest.approx([0.25] * 3)
