"""Reference models: output shapes, parameter counts of the GPM/FOT reference nets (by hand), batch-statistics
BatchNorm, and one batched step under torch.func.vmap + functional_call (the batched engine's path)."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

from cfl.models import ModelShape, build_model
from cfl.models.buffers import running_stats
from cfl.models.layers import protected_layers

# (model, shape, parameters counted by hand from the GPM/FOT reference nets)
REFERENCE = [
    # 784*400+400 + 2*(400*400+400) + 400*10+10
    ("mlp", ModelShape((784,), 10, 10, False), 638_810),
    # convs 3*64*16 + 64*128*9 + 128*256*4; fc 1024*2048 + 2048*2048; 10 heads 10*2048; no biases
    ("alexnet", ModelShape((3, 32, 32), 10, 10, True), 3_072 + 73_728 + 131_072 + 2_097_152 + 4_194_304 + 204_800),
    # nf=20: stem 540; stages 14,400 + 51,200 + 204,800 + 819,200 (1x1 shortcuts included); 5 heads 10*640
    ("resnet18-reduced", ModelShape((3, 32, 32), 10, 5, True), 540 + 14_400 + 51_200 + 204_800 + 819_200 + 32_000),
    # nf=32: convs 2,790,240; BatchNorm weight+bias 4,800; 20 heads 5*2304
    ("resnet18-mini", ModelShape((3, 84, 84), 5, 20, True), 2_790_240 + 4_800 + 230_400),
]


@pytest.mark.parametrize("name,shape,count", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_output_shape_and_parameter_count(name, shape, count):
    torch.manual_seed(0)
    model = build_model(name, shape)
    assert sum(p.numel() for p in model.parameters()) == count
    out = model(torch.randn(3, *shape.input_shape), torch.tensor([0, 1, shape.num_tasks - 1]))
    assert out.shape == (3, shape.classes)


def test_heads_and_features_match_the_reference():
    assert build_model("resnet18-reduced", REFERENCE[2][1]).features == 640
    assert build_model("resnet18-mini", REFERENCE[3][1]).features == 2304
    alex = build_model("alexnet", REFERENCE[1][1])
    assert alex.head.weight.shape == (10, 10, 2048) and alex.head.bias is None
    assert all("bias" not in n for n, _ in alex.named_parameters())


def test_multi_head_picks_each_samples_task_head():
    torch.manual_seed(0)
    model = build_model("resnet18-reduced", ModelShape((3, 32, 32), 10, 5, True)).eval()
    x = torch.randn(2, 3, 32, 32)
    both = model(x, torch.tensor([1, 4]))
    assert torch.allclose(both[0], model(x[:1], torch.tensor([1]))[0], atol=1e-5)
    assert torch.allclose(both[1], model(x[1:], torch.tensor([4]))[0], atol=1e-5)


def test_mini_resnet_batch_norm_uses_batch_statistics_only():
    model = build_model("resnet18-mini", ModelShape((3, 84, 84), 5, 2, True))
    assert not list(model.buffers())  # nothing to average besides parameters
    model.eval()
    x = torch.randn(4, 3, 84, 84)
    t = torch.zeros(4, dtype=torch.long)
    # batch statistics in evaluation too: a sample's output depends on the rest of its batch
    assert not torch.allclose(model(x, t)[:2], model(x[:2], t[:2]), atol=1e-4)


def test_convs_are_protected_layers_and_heads_are_not():
    kinds = protected_layers(build_model("resnet18-reduced", ModelShape((3, 32, 32), 10, 5, True)))
    assert kinds["conv1.weight"] == "conv" and kinds["blocks.2.shortcut.0.weight"] == "conv"
    assert not any(k.startswith("head") for k in kinds) and len(kinds) == 1 + 8 * 2 + 3
    alex = protected_layers(build_model("alexnet", ModelShape((3, 32, 32), 10, 10, True)))
    assert list(alex.values()) == ["conv"] * 3 + ["linear"] * 2


@pytest.mark.parametrize("name,shape", [(r[0], r[1]) for r in REFERENCE[1:]], ids=[r[0] for r in REFERENCE[1:]])
def test_one_batched_step_under_vmap_matches_each_client(name, shape):
    """Two clients with different parameters and data: vmapped loss and gradients equal per-client ones."""
    torch.manual_seed(0)
    model = build_model(name, shape)
    model.eval() if name == "alexnet" else model.train()  # dropout off; BatchNorm on batch stats either way
    params = {k: torch.stack([v.detach(), v.detach() + 0.01 * torch.randn_like(v)]) for k, v in
              model.named_parameters()}
    x = torch.randn(2, 3, *shape.input_shape)
    y = torch.randint(0, shape.classes, (2, 3))
    t = torch.tensor([[0, 1, 1], [1, 0, 1]])

    def loss(p, xb, yb, tb):
        return torch.nn.functional.cross_entropy(functional_call(model, p, (xb, tb)), yb)

    grads = vmap(grad(loss), randomness="different")(params, x, y, t)
    batch_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    for c in range(2):
        own = {k: v[c].clone().requires_grad_() for k, v in params.items()}
        expected = torch.autograd.grad(loss(own, x[c], y[c], t[c]), list(own.values()))
        for (k, g), e in zip(grads.items(), expected, strict=True):
            if not batch_norm:
                torch.testing.assert_close(g[c], e, atol=1e-5, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
                continue
            # BatchNorm on 3 samples amplifies float32's rounding, and torch's batching rule for conv computes in
            # another order: on an AMD EPYC with torch 2.14.1 the vmapped resnet18-mini gradients are 2.3e-3 (relative
            # norm) from a float64 reference, the per-client ones 4.3e-4
            relative = float((g[c] - e).norm() / e.norm().clamp_min(1e-12))
            assert relative < 1e-2, f"{k}: vmapped gradient {relative:.3g} (relative norm) from client {c}'s own"


def test_dropout_noise_fields_match_the_words_bytes_without_view():
    """The fallback for torches whose vmap cannot ``view(int8)``: same signed fields, same order."""
    from cfl.models.dropout import split_words

    word = torch.tensor([0x7F80_0102_FF00_8001], dtype=torch.int64)
    assert split_words(word, 8).tolist() == [1, -128, 0, -1, 2, 1, -128, 127]
    assert split_words(word, 16).tolist() == [-32767, -256, 258, 32640]
    words = torch.empty(64, dtype=torch.int64).random_(-(2**63), None)
    for bits, dtype in ((8, torch.int8), (16, torch.int16)):
        batched = vmap(lambda w, b=bits: split_words(w, b), randomness="different")(words.view(4, 16))
        assert torch.equal(batched, words.view(4, 16).view(dtype).long())


def test_running_bn_resnet_keeps_running_statistics_and_uses_them_in_evaluation():
    shape = ModelShape((3, 32, 32), 10, 5, True)
    model = build_model("resnet18-reduced-running-bn", shape)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 1 + 8 * 2 + 3 and all(m.track_running_stats for m in norms)  # stem, blocks, 1x1 shortcuts
    # the no-BatchNorm reduced ResNet-18's parameters plus a weight and a bias per BatchNorm channel
    plain = build_model("resnet18-reduced", shape)
    assert sum(p.numel() for p in model.parameters()) == \
        sum(p.numel() for p in plain.parameters()) + 2 * sum(m.num_features for m in norms)
    assert len(running_stats(model)) == 3 * len(norms)  # running_mean, running_var, num_batches_tracked
    model.eval()
    x, t = torch.randn(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)
    # running statistics in evaluation: a sample's output does not depend on the rest of its batch
    assert torch.allclose(model(x, t)[:2], model(x[:2], t[:2]), atol=1e-5)
