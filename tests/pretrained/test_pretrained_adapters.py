"""Training through a frozen pretrained ViT: L2P's prompt selection by hand, LoRA equal to its
merged weight, only the trainable subset kept per client, sent and checkpointed, batched equal to sequential, a
run that resumes bit-identically, and the refusals of model.train."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm", reason="the pretrained backbones need the extra pretrained (timm, safetensors)")
pytest.importorskip("safetensors", reason="the pretrained backbones need the extra pretrained")

from safetensors.torch import save_file  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402
from cfl.pretrained.backbones import build_backbone  # noqa: E402
from cfl.pretrained.lora import LoRALinear  # noqa: E402
from cfl.pretrained.prompt_pool import PromptPool, key_distance, select  # noqa: E402
from cfl.tensors import nbytes  # noqa: E402
from cfl.validation import from_dict  # noqa: E402
from tests.conftest import make_stream  # noqa: E402
from tests.run_pairs import assert_batched_equals_sequential, killed_and_resumed  # noqa: E402
from tests.weights_files import as_trained  # noqa: E402

SIZE = 32
METHOD = {"prompts": "l2p", "lora": "lora"}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(2)
    state = as_trained(build_backbone("vit-ti16", SIZE).state_dict())  # not flagged as a fresh initialisation
    path = tmp_path_factory.mktemp("weights") / "vit-ti16.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def config(tmp_path: Path, train: str, weights: str = "random", size: int = SIZE, **extra: object):
    model = {"name": "vit-ti16", "weights": weights, "image_size": size, "train": train,
             **({"prompt_pool": 4, "prompt_length": 2, "prompt_top_k": 2} if train == "prompts" else {})}
    return from_dict({"stream": {"name": "split-digits", "num_tasks": 2}, "model": model,
                      "method": {"name": METHOD.get(train, "fedavg")}, "num_clients": 4, "clients_per_round": 3,
                      "rounds_per_task": 2, "batch_size": 8, "lr": 0.01, "data_root": str(tmp_path / "data"),
                      "wandb": {"mode": "disabled"}, **extra})


def runner(cfg, **kw: int):
    from cfl.engine.rounds.runner import Runner
    from cfl.pretrained.features import with_backbone

    stream = make_stream("class", num_tasks=2, image=(1, 8, 8), n_train=kw.get("n", 24), n_test=8)
    return Runner(cfg, with_backbone(cfg, stream, torch.device("cpu"), quiet=True))


def test_prompt_selection_by_hand():
    keys = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]])
    query = torch.tensor([[2.0, 0, 0], [0, 0, 3]])
    chosen, sims = select(query, keys, 2)
    # query 0: cos 1 with key 0, 1/sqrt2 with key 3, 0 with keys 1, 2; query 1: cos 1 with key 2, 0 with the others
    assert chosen[0].tolist() == [0, 3] and chosen[1, 0] == 2
    assert torch.allclose(sims[0], torch.tensor([1, 1 / math.sqrt(2)]))
    assert torch.allclose(key_distance(query, keys, 2), torch.tensor([1 - 1 / math.sqrt(2), 1.0]))
    pool = PromptPool(4, 2, 2, 3)
    with torch.no_grad():
        pool.keys.copy_(keys)
        pool.prompts.copy_(torch.arange(24.0).view(4, 2, 3))
    out = pool(query[:1])  # prompts 0 then 3, their tokens in order
    assert torch.equal(out[0], torch.cat([pool.prompts[0], pool.prompts[3]]).detach())


def test_lora_forward_equals_the_merged_weight():
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 9)
    layer = LoRALinear(base, rank=2, alpha=3.0)
    with torch.no_grad():
        layer.lora_b.normal_()  # B starts at zero: make the update non-trivial
    x = torch.randn(5, 6)
    merged = base.weight + 1.5 * layer.lora_b @ layer.lora_a
    assert torch.allclose(layer.merged(), merged)
    assert torch.allclose(layer(x), torch.nn.functional.linear(x, merged, base.bias), atol=1e-6)
    assert [k for k, _ in layer.named_parameters()] == ["lora_a", "lora_b"]
    assert layer.state_dict().keys() == {"lora_a", "lora_b"}  # the frozen weight is not saved with the factors


@pytest.mark.parametrize("train", ["prompts", "lora"])
def test_only_the_trainable_subset_is_kept_sent_and_counted(tmp_path, train):
    run = runner(config(tmp_path, train))
    names = set(run.params)
    frozen = {k for k, _ in run.model.named_buffers()}
    assert frozen and not names & frozen  # the backbone's weights are buffers of the template only
    assert all(k.startswith("head.") or ("prompt." in k if train == "prompts" else ".lora_" in k) for k in names)
    assert run.buffers == {}  # nothing of the backbone travels as running statistics either
    trainable = {k: v for k, v in run.model.named_parameters()}
    assert run.model_bytes == nbytes(trainable) < nbytes(dict(run.model.named_buffers())) / 50
    record = run.run_round(0, 0)
    assert record["upload_bytes"] == 3 * run.model_bytes  # three clients sampled, each sends the subset


@pytest.mark.parametrize("train", ["prompts", "lora"])
def test_batched_equals_sequential(tmp_path, train):
    runs = [runner(config(tmp_path, train, client_execution=e)) for e in ("batched", "sequential")]
    for r in runs:
        r.run()
    assert_batched_equals_sequential(*runs)
    batched = runs[0]
    moved = [k for k in batched.params if not torch.equal(batched.params[k], runner(config(tmp_path, train)).params[k])]
    assert any("prompt.keys" in k or ".lora_a" in k for k in moved)  # the adapter trained, keys by the key loss


def test_run_from_a_weights_file_resumes_bit_identically_and_checkpoints_only_the_subset(weights, tmp_path,
                                                                                          monkeypatch):
    # at 16 px (one patch, its position embeddings resampled from the file's 32 px): seconds on a CPU
    cfg = config(tmp_path, "prompts", str(weights), 16, checkpoint_every=1, num_clients=3, batch_size=32)
    full, resumed = killed_and_resumed(cfg, tmp_path, monkeypatch)
    assert full["backbone"]["train"] == "prompts" and full["random_backbone"] is False
    assert resumed["acc_matrix"] == full["acc_matrix"] and resumed["upload_bytes"] == full["upload_bytes"]
    final = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)
    reference = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)["params"]
    assert set(final["params"]) == {"prompt.prompts", "prompt.keys", "head.weight", "head.bias"}
    assert all(torch.equal(final["params"][k], reference[k]) for k in reference)
    assert (tmp_path / "part" / "checkpoint.pt").stat().st_size < 1_000_000  # the 22 MB backbone is not in it


@pytest.mark.parametrize(("extra", "method", "words"), [
    ({"train": "prompts"}, "fedavg", "use method l2p"),
    ({"train": "head"}, "l2p", "method l2p needs model.train: prompts"),
    ({"train": "lora"}, "afcl", "method afcl needs model.train: head"),
    ({"train": "prompts", "prompt_top_k": 11}, "l2p", "selects more prompts than the pool"),
    ({"train": "prompts", "lora_rank": 8}, "l2p", "model.lora_rank is read only under another model.train"),
])
def test_model_train_refusals(extra, method, words):
    data = {"stream": {"name": "split-digits", "num_tasks": 2}, "method": {"name": method},
            "model": {"name": "vit-ti16", "weights": "random", "image_size": SIZE, **extra},
            "wandb": {"mode": "disabled"}}
    with pytest.raises(ConfigError, match=words):
        from_dict(data)


def test_adapter_keys_are_refused_on_a_model_trained_from_scratch():
    with pytest.raises(ConfigError, match="model.prompt_pool"):
        from_dict({"stream": {"name": "split-digits"}, "model": {"name": "digits-mlp", "prompt_pool": 3},
                   "wandb": {"mode": "disabled"}})
