"""DualPrompt: prefix attention by hand and against transcriptions of the official codes' lines (JAX
google-research/l2p and the PyTorch port JH-LEE-KR/dualprompt-pytorch), the E-prompt choice at training and
evaluation, the key pull by hand, the server's copy of a finished task's E-prompts, and the refusals."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from cfl.config.schema import ConfigError
from cfl.methods.dualprompt import DualPrompt, DualPromptHyperparams, pull
from cfl.methods.server_hooks import ServerEvent
from cfl.pretrained.dual_prompt import DualPrompts, task_prompts
from cfl.pretrained.prefix_attention import prefixed_attention


def _attention(dim: int = 8, heads: int = 2) -> torch.nn.Module:
    from timm.models.vision_transformer import Attention

    torch.manual_seed(0)
    attn = Attention(dim, num_heads=heads, qkv_bias=True)
    attn.fused_attn = False
    return attn.eval()


def test_prefix_attention_by_hand_one_head_one_token():
    pytest.importorskip("timm")
    attn = _attention(2, 1)
    with torch.no_grad():  # q = k = v = x, no projection
        attn.qkv.weight.copy_(torch.cat([torch.eye(2)] * 3))
        attn.qkv.bias.zero_()
        attn.proj.weight.copy_(torch.eye(2))
        attn.proj.bias.zero_()
    x = torch.tensor([[[1.0, 0.0]]])
    prefix = torch.tensor([[[[2.0, 0.0]], [[0.0, 3.0]]]])  # key (2, 0), value (0, 3)
    # scores q.[pk; k] / sqrt(2) = (2, 1) / sqrt(2); weights softmax; output w0 (0, 3) + w1 (1, 0)
    w0 = 1 / (1 + math.exp(-1 / math.sqrt(2)))
    out = prefixed_attention(attn, x, prefix)
    assert torch.allclose(out, torch.tensor([[[1 - w0, 3 * w0]]]), atol=1e-6)


def _port_pret_attention(attn: torch.nn.Module, x: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
    """The PyTorch port's ``PreT_Attention.forward`` (attention.py), transcribed; ``prompt`` (B, 2, L, H, hd)."""
    b, n, c = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, c // attn.num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    prompt = prompt.permute(1, 0, 3, 2, 4).contiguous()
    k = torch.cat([prompt[0], k], dim=2)
    v = torch.cat([prompt[1], v], dim=2)
    a = ((q @ k.transpose(-2, -1)) * attn.scale).softmax(dim=-1)
    return attn.proj((a @ v).transpose(1, 2).reshape(b, n, c))


def test_prefix_attention_equals_the_official_pret_attention():
    pytest.importorskip("timm")
    attn = _attention(8, 2)
    x, prompt = torch.randn(3, 5, 8), torch.randn(3, 2, 4, 2, 4)
    ours = prefixed_attention(attn, x, prompt.reshape(3, 2, 4, 8))
    assert torch.allclose(ours, _port_pret_attention(attn, x, prompt), atol=1e-6)


def _pools(pool: int = 4, length: int = 2, top_k: int = 2, width: int = 4) -> DualPrompts:
    torch.manual_seed(1)
    return DualPrompts(pool, length, top_k, width, g_length=3, g_layers=1, e_layers=2)


def test_e_prefixes_equal_the_jax_codes_take_and_reshape():
    """google-research/l2p models/prompt.py: ``jnp.take(prompt, idx, axis=2)`` of (layers, 2, pool, L, D) gives
    (layers, 2, B, top_k, L, D), reshaped to (layers, 2, B, top_k * L, D); vit.py feeds layer i's slice."""
    p = _pools()
    query, task = torch.randn(3, 4), torch.tensor([0, 1, 1])
    official = p.prompts.detach().permute(1, 2, 0, 3, 4)  # the code's (layers, 2, pool, L, D)
    idx = task_prompts(task, 2)
    taken = official[:, :, idx]  # (layers, 2, B, top_k, L, D)
    jax = taken.reshape(2, 2, 3, 2 * 2, 4)
    ours = p(query, task)
    assert len(ours) == 3 and torch.equal(ours[0], p.g[0].detach().expand(3, -1, -1, -1))
    for layer in range(2):
        assert torch.equal(ours[1 + layer], jax[layer].permute(1, 0, 2, 3))  # (B, 2, top_k * L, D)


def test_the_pytorch_ports_reshape_mixes_key_and_value_halves_across_the_batch():
    """dualprompt-pytorch prompt.py reshapes (layers, 2, B, top_k, L, ...) to (layers, B, 2, ...): for one input
    it is ours, for more it hands input 0 two key halves (cfl follows the JAX code: docs/methods/dualprompt.md)."""
    p = _pools(top_k=1)
    official = p.prompts.detach().permute(1, 2, 0, 3, 4)
    for batch in (1, 2):
        task = torch.zeros(batch, dtype=torch.long)
        raw = official[:, :, task_prompts(task, 1)]  # (layers, 2, B, 1, L, D)
        port = raw.reshape(2, batch, 2, 2, 4)
        ours = p(torch.randn(batch, 4), task)[1]
        assert torch.equal(ours, port[0]) == (batch == 1)
    assert torch.equal(port[0][0, 1], official[0, 0, 0])  # input 0's "value" prefix is the key prompt


def test_evaluation_picks_the_e_prompts_of_the_most_similar_keys():
    p = _pools(top_k=1)
    with torch.no_grad():
        p.keys.copy_(torch.eye(4))
    query = torch.tensor([[0.1, 0.2, 3.0, 0.0], [5.0, 0.0, 0.0, 1.0]])
    assert p.chosen(query, None).tolist() == [[2], [0]]
    assert all(torch.equal(a, b) for a, b in zip(p(query, None), p(query, torch.tensor([2, 0])), strict=True))
    assert task_prompts(torch.tensor([1, 3]), 2).tolist() == [[2, 3], [6, 7]]


def test_pull_by_hand():
    query = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    keys = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    # input 0 on task 0: cos((1,0), (1,0)) = 1 -> 0; input 1 on task 1: cos((1,1), (0,1)) = 1/sqrt(2)
    assert torch.allclose(pull(query, keys, torch.tensor([0, 1]), 1), torch.tensor([0.0, 1 - 1 / math.sqrt(2)]))


def _model(train: bool) -> torch.nn.Module:
    import timm

    from cfl.pretrained.adapted import AdaptedViT

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=16)
    model = AdaptedViT(vit, "dual-prompts", 4, 2, False, 16, "bicubic", prompt=(4, 2, 1), dual=(2, 1, 2))
    return model.train(train)


def test_training_moves_the_inputs_tasks_e_prompt_and_key_only():
    pytest.importorskip("timm")
    model = _model(True)
    assert sorted(n for n, _ in model.named_parameters()) == ["head.bias", "head.weight", "prompt.g",
                                                              "prompt.keys", "prompt.prompts"]
    x, task = torch.randn(3, 3, 8, 8), torch.ones(3, dtype=torch.long)
    loss = F.cross_entropy(model(x, task), torch.tensor([0, 1, 2])) + pull(model.query(x), model.prompt.keys,
                                                                           task, 1).sum()
    loss.backward()
    moved = lambda g: g.flatten(1).abs().sum(1) > 0  # noqa: E731
    assert moved(model.prompt.prompts.grad).tolist() == [False, True, False, False]
    assert moved(model.prompt.keys.grad).tolist() == [False, True, False, False]
    assert model.prompt.g.grad.abs().sum() > 0
    assert "G-prompts, E-prompts and keys" in model.summary()


def test_evaluation_ignores_the_task_and_uses_the_query():
    pytest.importorskip("timm")
    model = _model(False)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        chosen = model.prompt.chosen(model.query(x), None)[:, 0]
        model.train()
        forced = model.features(x, chosen)
        model.eval()
        assert torch.equal(model.features(x, torch.tensor([3, 3])), forced)
    with pytest.raises(ValueError, match="pass its task"):
        model.train().features(x)


def _method(shared: bool = True, top_k: int = 1) -> DualPrompt:
    info = SimpleNamespace(model=SimpleNamespace(prompt=SimpleNamespace(top_k=top_k)), task_classes=(),
                           scenario="class")
    return DualPrompt(DualPromptHyperparams(shared_pool=shared), info)


def test_a_finished_tasks_e_prompts_seed_the_next_tasks():
    prompts = torch.arange(6.0).view(6, 1)
    event = ServerEvent("task_end", {}, 1, {"prompt.prompts": prompts})
    change = _method(top_k=2).server_event(event)
    assert change.params["prompt.prompts"].flatten().tolist() == [0, 1, 2, 3, 2, 3]
    assert prompts.flatten().tolist() == [0, 1, 2, 3, 4, 5]  # the global model is not written into
    assert _method(top_k=2).server_event(ServerEvent("task_end", {}, 2, {"prompt.prompts": prompts})) is None
    assert _method(shared=False).server_event(event) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"pool": 3}, "prompt_pool 3 is fewer than stream.num_tasks 4"),
    ({"weight_decay": 0.1}, "set weight_decay: 0"),
])
def test_refusals(change: dict, message: str):
    cfg = SimpleNamespace(stream=SimpleNamespace(num_tasks=4), weight_decay=change.get("weight_decay", 0.0),
                          model=SimpleNamespace(prompt_pool=change.get("pool", 4), prompt_top_k=1))
    with pytest.raises(ConfigError, match=message):
        DualPrompt.check(DualPromptHyperparams(), cfg)


def _config(tmp_path, **extra):
    from cfl.validation import from_dict

    model = {"name": "vit-ti16", "weights": "random", "image_size": 16, "train": "dual-prompts", "prompt_pool": 2,
             "prompt_length": 2, "prompt_top_k": 1, "g_prompt_length": 2, "g_prompt_layers": 1, "e_prompt_layers": 2}
    return from_dict({"stream": {"name": "split-digits", "num_tasks": 2}, "model": model,
                      "method": {"name": "dualprompt"}, "num_clients": 4, "clients_per_round": 3,
                      "rounds_per_task": 2, "batch_size": 8, "lr": 0.01, "weight_decay": 0.0,
                      "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"}, **extra})


def test_an_engine_run_trains_each_tasks_e_prompt_and_seeds_the_next(tmp_path):
    pytest.importorskip("timm")
    from tests.run_pairs import assert_batched_equals_sequential, tiny_pretrained_runner

    run = tiny_pretrained_runner(_config(tmp_path))
    start = run.params
    run.run_round(0, 0)
    after = run.params
    assert torch.equal(after["prompt.prompts"][1], start["prompt.prompts"][1])  # task 1's waits
    assert torch.equal(after["prompt.keys"][1], start["prompt.keys"][1])
    assert not torch.equal(after["prompt.prompts"][0], start["prompt.prompts"][0])
    assert not torch.equal(after["prompt.g"], start["prompt.g"])
    run.run_round(0, 1)
    run.task_end(0)  # the server's copy: task 1's E-prompt starts from task 0's, its key does not
    ended = run.params
    assert torch.equal(ended["prompt.prompts"][1], ended["prompt.prompts"][0])
    assert torch.equal(ended["prompt.keys"][1], start["prompt.keys"][1])
    whole = [tiny_pretrained_runner(_config(tmp_path, client_execution=e)) for e in ("batched", "sequential")]
    for r in whole:
        r.run()
    assert_batched_equals_sequential(*whole)


def test_resume_is_bit_identical(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    from tests.run_pairs import assert_resumes_bit_identically

    assert_resumes_bit_identically(_config(tmp_path, checkpoint_every=1, num_clients=3), tmp_path, monkeypatch)
