"""The last ViT block over the head's rows only (cfl/pretrained/final_block.py): the same outputs and input
gradients as timm's whole block at those rows, with and without prefixes, and the same features in every
``model.train`` mode as the model that runs the whole block."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("timm", reason="the pretrained backbones need the extra pretrained (timm, safetensors)")

from cfl.pretrained.adapted import TRAIN_MODES, AdaptedViT  # noqa: E402
from cfl.pretrained.backbones import build_backbone  # noqa: E402
from cfl.pretrained.final_block import MIN_ROWS, block_rows, is_plain, pooled, window  # noqa: E402
from cfl.pretrained.prefix_attention import prefixed_block  # noqa: E402


@pytest.mark.parametrize("rows, tokens, expected", [
    (slice(0, 1), 197, slice(0, 8)),     # [CLS]: widened to MIN_ROWS
    (slice(15, 16), 20, slice(12, 20)),  # Powder's [CLS] after 15 prompt rows: widened backwards at the end
    (slice(1, 26), 222, slice(1, 26)),   # L2P's 25 prompt rows: long enough as they are
    (slice(0, 1), 5, slice(0, 5)),       # fewer tokens than MIN_ROWS: all of them
])
def test_window_by_hand(rows, tokens, expected):
    assert MIN_ROWS == 8
    assert window(rows, tokens) == expected


def vit():
    torch.manual_seed(0)
    model = build_backbone("vit-ti16", 64).eval()  # 16 patches + [CLS]
    for block in model.blocks:
        block.attn.fused_attn = False
    model.requires_grad_(False)
    return model


@pytest.mark.parametrize("with_prefix", [False, True])
@pytest.mark.parametrize("rows", [slice(0, 4), slice(3, 12), slice(0, 17)])
def test_block_rows_equal_the_whole_block_at_those_rows(rows, with_prefix):
    model = vit()
    block = model.blocks[-1]
    assert is_plain(block)
    x = torch.randn(2, 17, 192, requires_grad=True)
    prefix = torch.randn(2, 2, 3, 192) if with_prefix else None
    whole = prefixed_block(block, x, prefix)[:, rows]
    (grad_whole,) = torch.autograd.grad(whole.square().sum(), x)
    part = block_rows(block, x, rows, prefix)
    (grad_part,) = torch.autograd.grad(part.square().sum(), x)
    assert part.shape == whole.shape
    torch.testing.assert_close(part, whole, rtol=0, atol=1e-5)
    torch.testing.assert_close(grad_part, grad_whole, rtol=0, atol=1e-4)
    assert not torch.equal(block_rows(block, x, slice(0, 4)), block_rows(block, x * 2, slice(0, 4)))


def test_a_non_plain_block_is_refused_by_is_plain():
    gated, without_mlp = vit().blocks[-1], vit().blocks[-1]
    gated.attn.gate = torch.nn.Linear(192, 3)
    del without_mlp.mlp
    assert is_plain(vit().blocks[-1]) and not is_plain(gated) and not is_plain(without_mlp)


@pytest.mark.parametrize("fused", [False, True])
def test_pooled_equals_timms_forward_with_either_attention(fused):
    model, x = vit(), torch.randn(5, 3, 64, 64)
    for block in model.blocks:
        block.attn.fused_attn = fused
    with torch.no_grad():
        torch.testing.assert_close(pooled(model, x), model(x), rtol=0, atol=1e-5)


def test_pooled_is_timms_forward_on_another_pooling():
    model, x = vit(), torch.randn(5, 3, 64, 64)
    model.global_pool = "avg"  # the patch tokens' mean: every row is read
    with torch.no_grad():
        assert torch.equal(pooled(model, x), model(x))


CASES = [(t, 0) for t in TRAIN_MODES if t != "all"] + [("components", 12)]  # 12: a prefix in the last block too


def head_rows(train: str, tokens: torch.Tensor) -> torch.Tensor:
    """The rows each mode's head reads from the final norm's output over every token, written out by hand."""
    if train == "prompts":
        return tokens[:, 1:26].mean(1)  # L2P: the 5 x 5 selected prompts after [CLS], averaged
    if train == "task-components":
        return tokens[:, 2 * 5]  # Powder: [CLS] after two prepended prompts of 5 (blocks 4 and 11)
    return tokens[:, 0]  # [CLS]


@pytest.mark.parametrize("train, component_layers", CASES)
def test_every_mode_reads_the_same_features_as_the_whole_last_block(train, component_layers):
    torch.manual_seed(1)
    model = AdaptedViT(vit(), train, classes=4, num_tasks=2, multi_head=False, size=64, interpolation="bilinear",
                       prompt=(10, 8 if component_layers else 5, 5), component_layers=component_layers,
                       prompt_blocks=(4, 11))
    assert model.rows_only
    x, task = torch.randn(3, 3, 64, 64), torch.tensor([0, 1, 1])
    rows_only = model.features(x, task)
    model.rows_only = False
    normed = []
    model.vit.norm.register_forward_hook(lambda _module, _args, out: normed.append(out))
    whole = model.features(x, task)
    prepended = {"prompts": 25, "task-components": 10, "components": 0 if component_layers else 5}.get(train, 0)
    assert normed[-1].shape[1] == 17 + prepended  # every token
    torch.testing.assert_close(whole, head_rows(train, normed[-1]), rtol=0, atol=0)
    torch.testing.assert_close(rows_only, whole, rtol=0, atol=1e-5)


def test_full_fine_tuning_runs_the_whole_block():
    model = AdaptedViT(vit(), "all", classes=4, num_tasks=2, multi_head=False, size=64, interpolation="bilinear")
    assert not model.rows_only
