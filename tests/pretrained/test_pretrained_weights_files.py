"""Weights files that must not pass unchecked (docs/pretrained.md, "Checks before any data"): an ``.npz`` with a
wrong shape or more blocks than the backbone, NaN or inf values, two state dicts in one ``.pth``, integer
weights, a symbolic link loop, an empty ``model.weights``, a resampled ``.npz``, a LoRA rank above the layers'
width, a file replaced under the same size and time, a freshly initialised file; and resuming on another file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("timm", reason="the pretrained backbones need the extra pretrained (timm, safetensors)")
pytest.importorskip("safetensors", reason="the pretrained backbones need the extra pretrained")

from safetensors.torch import save_file  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402
from cfl.pretrained.backbones import build_backbone  # noqa: E402
from cfl.pretrained.weights import sha256_of  # noqa: E402
from cfl.validation import from_dict  # noqa: E402
from tests.weights_files import as_trained, big_vision_arrays, save_big_vision  # noqa: E402

SIZE = 32
BLOCKS = "Transformer/encoderblock/"


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return as_trained(build_backbone("vit-ti16", SIZE).state_dict())


def config(tmp_path: Path, **model: object) -> dict:
    return {"stream": {"name": "split-digits", "num_tasks": 2}, "model": {"name": "vit-ti16", "image_size": SIZE,
                                                                          **model},
            "num_clients": 3, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 16,
            "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"}}


def refusal(tmp_path: Path, **model: object) -> str:
    with pytest.raises(ConfigError) as err:
        from_dict(config(tmp_path, **model))
    return str(err.value)


def saved(tmp_path: Path, name: str, state: dict[str, torch.Tensor]) -> str:
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return str(path)


def test_npz_loads_and_its_shapes_and_blocks_are_checked(state, tmp_path):
    from cfl.pretrained.loaded import loaded_backbone

    arrays = big_vision_arrays(state, heads=3)
    good = save_big_vision(tmp_path / "good.npz", arrays)
    loaded = loaded_backbone(from_dict(config(tmp_path, weights=str(good))))
    assert all(torch.equal(v, state[k]) for k, v in loaded.model.state_dict().items())
    bias = {**arrays, f"{BLOCKS}LayerNorm_0/bias": arrays[f"{BLOCKS}LayerNorm_0/bias"][:, :1]}  # (1,) for (192,)
    message = refusal(tmp_path, weights=str(save_big_vision(tmp_path / "bias.npz", bias)))
    assert "bias.npz': key 'blocks.0.norm1.bias' has shape (1,), the backbone's is (192,)" in message
    deep = {k: np.concatenate([v, v]) if k.startswith(BLOCKS) else v for k, v in arrays.items()}  # 24 blocks
    message = refusal(tmp_path, weights=str(save_big_vision(tmp_path / "deep.npz", deep)))
    assert f"key '{BLOCKS}LayerNorm_0/scale' stacks 24 blocks, the backbone has 12" in message
    extra = {**arrays, "Transformer/extra/kernel": np.zeros(3, np.float32)}
    assert "unexpected key(s) Transformer/extra/kernel" in refusal(tmp_path, weights=str(
        save_big_vision(tmp_path / "extra.npz", extra)))


def test_a_resampled_npz_says_so(state, tmp_path):
    from cfl.pretrained.loaded import loaded_backbone

    path = save_big_vision(tmp_path / "w.npz", big_vision_arrays(state, heads=3))
    notes = loaded_backbone(from_dict(config(tmp_path, weights=str(path), image_size=48))).weights.notes
    assert "position embeddings resampled from (1, 5, 192) to (1, 10, 192) (model.image_size)" in notes


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_file_and_key(state, tmp_path, value):
    qkv = state["blocks.3.attn.qkv.weight"].clone()
    qkv[0, 0] = value
    message = refusal(tmp_path, weights=saved(tmp_path, "bad.safetensors", {**state, "blocks.3.attn.qkv.weight": qkv}))
    assert "bad.safetensors': key 'blocks.3.attn.qkv.weight' holds" in message and "the file is damaged" in message
    arrays = big_vision_arrays({**state, "blocks.3.attn.qkv.weight": qkv}, heads=3)
    message = refusal(tmp_path, weights=str(save_big_vision(tmp_path / "bad.npz", arrays)))
    assert "bad.npz': key 'blocks.3.attn.qkv.weight' holds" in message


def test_a_pth_with_two_state_dicts_is_refused(state, tmp_path):
    path = tmp_path / "two.pth"
    torch.save({"model": state, "state_dict_ema": state, "epoch": 3}, path)
    message = refusal(tmp_path, weights=str(path))
    assert "holds 2 state dicts (model, state_dict_ema" in message and "save the one you mean alone" in message
    one = tmp_path / "one.pth"
    torch.save({"model": state, "epoch": 3}, one)
    from_dict(config(tmp_path, weights=str(one)))  # one state dict beside other entries: taken


def test_integer_weights_are_refused_and_half_precision_is_said(state, tmp_path):
    ints = {**state, "norm.weight": state["norm.weight"].to(torch.int32)}
    message = refusal(tmp_path, weights=saved(tmp_path, "int.safetensors", ints))
    assert "key 'norm.weight' holds torch.int32 values where the backbone holds torch.float32" in message
    from cfl.pretrained.loaded import loaded_backbone

    half = saved(tmp_path, "half.safetensors", {k: v.half() for k, v in state.items()})
    notes = loaded_backbone(from_dict(config(tmp_path, weights=half))).weights.notes
    assert "tensors stored as torch.float16 are cast to the backbone's float32" in notes


def test_a_symlink_loop_and_an_empty_path_are_named_as_such(tmp_path):
    loop = tmp_path / "loop.safetensors"
    os.symlink(loop, loop)
    message = refusal(tmp_path, weights=str(loop))
    assert "is a symbolic link that does not lead to a file" in message and "does not exist" not in message
    message = refusal(tmp_path, weights="")
    assert "'model.weights' is empty" in message and "'.'" not in message


def test_a_lora_rank_above_the_layer_width_is_refused(tmp_path):
    cfg = {**config(tmp_path, weights="random", train="lora", lora_rank=193), "method": {"name": "lora"}}
    with pytest.raises(ConfigError, match="model.lora_rank 193 exceeds the width 192"):
        from_dict(cfg)


def test_a_file_replaced_with_the_same_size_and_time_is_loaded_again(state, tmp_path):
    from cfl.pretrained.loaded import loaded_backbone

    path = Path(saved(tmp_path, "w.safetensors", state))
    first = loaded_backbone(from_dict(config(tmp_path, weights=str(path))))
    stamp = path.stat()
    saved(tmp_path, "w.safetensors", {**state, "norm.bias": state["norm.bias"] + 1})  # same size
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_size == stamp.st_size and path.stat().st_mtime_ns == stamp.st_mtime_ns
    second = loaded_backbone(from_dict(config(tmp_path, weights=str(path))))
    assert second.weights.sha256 == sha256_of(path) != first.weights.sha256
    assert torch.equal(second.model.state_dict()["norm.bias"], state["norm.bias"] + 1)


def test_a_freshly_initialised_file_is_flagged_with_its_evidence_unless_said_trained(tmp_path):
    from cfl.app.single_run import execute
    from cfl.pretrained.loaded import loaded_backbone
    from cfl.report.wandb_names import shown_method

    torch.manual_seed(4)
    fresh = saved(tmp_path, "fresh.safetensors", build_backbone("vit-ti16", SIZE).state_dict())
    cfg = from_dict({**config(tmp_path, weights=fresh), "rounds_per_task": 1, "method": {"name": "fedncm"}})
    assert shown_method(cfg).endswith("(random backbone)")
    results = execute(cfg, tmp_path / "run", quiet=True)
    assert results["random_backbone"] is True and results["method"] == "fedncm (random backbone)"
    assert "every one of its 25 LayerNorm layers has weight exactly 1 and bias 0" in results["backbone"]["untrained"]
    said = loaded_backbone(from_dict(config(tmp_path, weights=fresh, weights_trained=True)))
    assert not said.weights.random and any("model.weights_trained: true takes it as trained" in n
                                           for n in said.weights.notes)
    with pytest.raises(ConfigError, match="'model.weights_trained' is true but 'model.weights' is random"):
        from_dict(config(tmp_path, weights="random", weights_trained=True))


def test_resume_on_another_weights_file_is_refused_naming_both_hashes(state, tmp_path, monkeypatch):
    from cfl.app.single_run import Checkpointer, execute, resume_config

    path = Path(saved(tmp_path, "w.safetensors", state))
    old = sha256_of(path)
    cfg = from_dict({**config(tmp_path, weights=str(path), train="lora"), "method": {"name": "lora"},
                     "checkpoint_every": 1, "batch_size": 32})
    saving = Checkpointer.__call__

    def killed_after_round(self) -> None:
        saving(self)
        if self.runner.progress.global_round >= 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "__call__", killed_after_round)
    with pytest.raises(Exception):  # noqa: B017 - RunStopped
        execute(cfg, tmp_path / "part", quiet=True)
    monkeypatch.setattr(Checkpointer, "__call__", saving)
    saved(tmp_path, "w.safetensors", {**state, "norm.bias": state["norm.bias"] + 1})
    before = sorted(p.name for p in (tmp_path / "part").iterdir())
    with pytest.raises(ConfigError) as err:
        execute(resume_config(tmp_path / "part", []), tmp_path / "part", quiet=True, resume=True)
    assert f"has SHA-256 {sha256_of(path)}, but the run was trained on a file with SHA-256 {old}" in str(err.value)
    assert sorted(p.name for p in (tmp_path / "part").iterdir()) == before
