"""The engine's speed-ups keep the results: folded weight decay, gradient-layout parameters, bit-noise dropout."""

import platform

import pytest
import torch
from torch.func import vmap

from cfl.engine.local.jobs import Hyper, RoundMethods
from cfl.engine.local.vmap import _match_grad_layout, _stacked_leaf
from cfl.engine.local.vmap_optim import SGDStep
from cfl.engine.rounds.runner import Runner
from cfl.methods.fedavg import FedAvg
from cfl.models.dropout import Dropout, keep_threshold
from cfl.validation import from_dict
from tests.conftest import make_stream


def _run(**kw):
    base = {"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 7, "lr": 0.1,
            "wandb": {"mode": "disabled"}}
    runner = Runner(from_dict({**base, **kw}), make_stream("task"))
    runner.run()
    return runner.params


@pytest.mark.parametrize("partition", [{"name": "iid"}, {"name": "quantity", "beta": 0.3}])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_folded_weight_decay_and_ragged_prefix_match_sequential(partition, momentum):
    # momentum 0: decay folded into one lerp pass; quantity: clients sorted by size, prefix steps
    kw = {"weight_decay": 0.05, "momentum": momentum, "partition": partition, "local_epochs": 2}
    batched, sequential = _run(**kw), _run(client_execution="sequential", **kw)
    for k in batched:
        assert torch.allclose(batched[k], sequential[k], atol=1e-5, rtol=1e-4), k


def test_fold_is_one_sgd_step_with_decay_and_skips_inactive_clients():
    hp = Hyper(lr=0.5, momentum=0.0, weight_decay=0.1, local_epochs=1, batch_size=1)
    p = {"w": torch.tensor([[1.0, 2.0], [1.0, 2.0]])}
    step = SGDStep(hp, p, RoundMethods([FedAvg(None, None)], [], []))
    assert step.fold_decay and step.loss_scale == pytest.approx(-10.0)
    g = {"w": torch.tensor([[0.2, -0.4], [0.2, -0.4]]) * step.loss_scale}  # autograd of the scaled loss
    step(0, p, g, torch.tensor([True, False]), [], RoundMethods([], [], []))
    # active client: w - lr (g + wd w) = [1 - 0.5 (0.2 + 0.1), 2 - 0.5 (-0.4 + 0.2)] = [0.85, 2.1]
    assert torch.allclose(p["w"], torch.tensor([[0.85, 2.1], [1.0, 2.0]]))


def test_parameters_take_the_gradient_layout():
    v = torch.arange(6.0).view(2, 3)
    p = {"w": _stacked_leaf(v, 4)}
    g = torch.zeros(4, 3, 2).transpose(1, 2)  # what vmap over F.linear returns
    out = _match_grad_layout(p, (g,))
    assert out["w"].stride() == g.stride() and out["w"].requires_grad
    assert torch.equal(out["w"], v.expand(4, 2, 3))
    assert _stacked_leaf(v, 4).is_contiguous()  # every round starts from the same layout


def test_keep_threshold_exact_for_multiples_of_1_256_and_close_otherwise():
    assert keep_threshold(0.5, 8) == (0, 0.5)
    t, keep = keep_threshold(0.2, 16)
    assert t == 13107 - 32768 and keep == (32768 - t) / 65536 and abs(keep - 0.8) < 2**-16


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_rate_scale_and_seed(p):
    layer = Dropout(p).train()
    x = torch.ones(200, 500)
    torch.manual_seed(3)
    out = layer(x)
    kept = out != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.005
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / layer.keep_prob))
    torch.manual_seed(3)
    assert torch.equal(layer(x), out)  # masks come from torch's global generator
    assert torch.equal(layer.eval()(x), x)


def test_dropout_under_vmap_draws_different_masks_per_client():
    layer = Dropout(0.5).train()
    out = vmap(layer, randomness="different")(torch.ones(4, 3, 37))  # 111 elements: not a multiple of 8
    assert out.shape == (4, 3, 37)
    assert not torch.equal(out[0], out[1])


def test_retaining_freed_memory_can_be_opted_out(monkeypatch):
    from cfl.engine.local import heap
    heap.retain_freed_memory.cache_clear()
    monkeypatch.setenv("CFL_RETAIN_FREED_MEMORY", "0")
    assert heap.retain_freed_memory() is False
    heap.retain_freed_memory.cache_clear()
    monkeypatch.delenv("CFL_RETAIN_FREED_MEMORY")
    if platform.libc_ver()[0] == "glibc":
        assert heap.retain_freed_memory() is True  # both mallopt calls accepted
    heap.retain_freed_memory.cache_clear()


def test_dropout_noise_follows_a_channels_last_layout():
    layer = Dropout(0.5).train()
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    torch.manual_seed(1)
    mask = layer.keep_mask(x)
    torch.manual_seed(1)
    nhwc = layer.keep_mask(x.permute(0, 2, 3, 1))  # the same memory, read as a contiguous (N, H, W, C) tensor
    assert mask.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(mask, nhwc.permute(0, 3, 1, 2))
