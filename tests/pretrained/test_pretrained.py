"""Pretrained backbones: a tiny timm ViT's random weights saved to a file and loaded back through
model.weights; refusals before any data; the random flag; the feature cache; an end-to-end run that resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("timm", reason="the pretrained backbones need the extra pretrained (timm, safetensors)")
pytest.importorskip("safetensors", reason="the pretrained backbones need the extra pretrained")

from safetensors.torch import save_file  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402
from cfl.pretrained.backbones import build_backbone  # noqa: E402
from cfl.pretrained.weights import sha256_of  # noqa: E402
from cfl.validation import from_dict  # noqa: E402
from tests.run_pairs import checkpointed_params, killed_and_resumed  # noqa: E402
from tests.weights_files import as_trained  # noqa: E402

SIZE = 32  # 2 x 2 patches of 16 pixels: a ViT-Ti/16 forward in milliseconds


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A vit-ti16 at 32 px with random weights (and a 3-class classifier, which cfl drops), as .safetensors."""
    torch.manual_seed(1)
    state = as_trained(build_backbone("vit-ti16", SIZE).state_dict())  # not flagged as a fresh initialisation
    state["head.weight"], state["head.bias"] = torch.zeros(3, 192), torch.zeros(3)
    path = tmp_path_factory.mktemp("weights") / "vit-ti16.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def config(tmp_path: Path, **model: object) -> dict:
    return {"stream": {"name": "split-digits", "num_tasks": 2}, "model": {"name": "vit-ti16", "image_size": SIZE,
                                                                          **model},
            "num_clients": 3, "clients_per_round": 3, "rounds_per_task": 2, "batch_size": 16,
            "data_root": str(tmp_path / "data"), "wandb": {"mode": "disabled"}}


def refusal(tmp_path: Path, monkeypatch, **model: object) -> str:
    """The ConfigError of validating the config; no data may be loaded on the way."""
    import cfl.data.load

    def no_data(*args: object, **kwargs: object) -> None:  # noqa: ARG001
        raise AssertionError("data loaded before the config was refused")

    monkeypatch.setattr(cfl.data.load, "load_stream", no_data)
    with pytest.raises(ConfigError) as err:
        from_dict(config(tmp_path, **model))
    return str(err.value)


def test_weights_file_loads_and_its_hash_is_checked(weights, tmp_path):
    cfg = from_dict(config(tmp_path, weights=str(weights), weights_sha256=sha256_of(weights)))
    from cfl.pretrained.loaded import loaded_backbone

    loaded = loaded_backbone(cfg)
    torch.manual_seed(1)
    expected = as_trained(build_backbone("vit-ti16", SIZE).state_dict())
    assert all(torch.equal(v, expected[k]) for k, v in loaded.model.state_dict().items())
    assert loaded.weights.sha256 == sha256_of(weights) and not loaded.weights.random
    assert any("classifier" in n for n in loaded.weights.notes)  # the file's head is dropped, and said


def test_wrong_hash_file_key_and_shape_are_refused_before_data(weights, tmp_path, monkeypatch):
    assert "SHA-256" in refusal(tmp_path, monkeypatch, weights=str(weights), weights_sha256="0" * 64)
    assert "does not exist" in refusal(tmp_path, monkeypatch, weights=str(tmp_path / "none.safetensors"))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    assert "not a weights file" in refusal(tmp_path, monkeypatch, weights=str(junk))
    from safetensors.torch import load_file

    state = load_file(str(weights))
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in state.items() if k != "norm.weight"}, str(missing))
    assert "missing key(s) norm.weight" in refusal(tmp_path, monkeypatch, weights=str(missing))
    extra = tmp_path / "extra.safetensors"
    save_file({**state, "blocks.99.weight": torch.zeros(1)}, str(extra))
    assert "unexpected key(s) blocks.99.weight" in refusal(tmp_path, monkeypatch, weights=str(extra))
    shaped = tmp_path / "shaped.safetensors"
    save_file({**state, "norm.weight": torch.zeros(7)}, str(shaped))
    assert "key 'norm.weight' has shape (7,)" in refusal(tmp_path, monkeypatch, weights=str(shaped))
    assert "needs 'model.weights'" in refusal(tmp_path, monkeypatch)
    assert "use method l2p" in refusal(tmp_path, monkeypatch, weights="random", train="prompts")


def test_weights_keys_are_refused_for_a_model_trained_from_scratch(tmp_path):
    with pytest.raises(ConfigError, match="read only by the pretrained backbones"):
        from_dict({**config(tmp_path), "model": {"name": "digits-mlp", "weights": "random"}})


def test_an_adapter_key_shared_by_several_training_modes_is_named_once(tmp_path):
    """model.prompt_length is read by four training modes: the refusal names it once (it named it four times)."""
    with pytest.raises(ConfigError) as err:
        from_dict({**config(tmp_path), "model": {"name": "digits-mlp", "prompt_length": 5}})
    assert str(err.value).count("'model.prompt_length'") == 1
    assert "'model.prompt_length' is read only by the pretrained backbones" in str(err.value)
    with pytest.raises(ConfigError, match="'model.prompt_length', 'model.lora_rank' are read only .* remove them"):
        from_dict({**config(tmp_path), "model": {"name": "digits-mlp", "prompt_length": 5, "lora_rank": 2}})


def test_closed_form_methods_need_a_backbone(tmp_path):
    with pytest.raises(ConfigError, match="runs on a frozen pretrained backbone"):
        from_dict({**config(tmp_path), "model": {"name": "digits-mlp"}, "method": {"name": "afcl"}})


def test_feature_cache_hit_and_invalidation(weights, tmp_path, capsys):
    from cfl.data.load import load_stream
    from cfl.pretrained.features import feature_stream

    cfg = from_dict(config(tmp_path, weights=str(weights)))
    raw = load_stream(**cfg.stream_fields(), device=torch.device("cpu"))
    first = feature_stream(cfg, raw, torch.device("cpu"))
    assert "computed in" in capsys.readouterr().err
    assert first.input_shape == (192,) and first.tasks[0].train_x.shape == (len(raw.tasks[0].train_y), 192)
    again = feature_stream(cfg, raw, torch.device("cpu"))
    assert "loaded from the cache" in capsys.readouterr().err
    assert all(torch.equal(a.train_x, b.train_x) for a, b in zip(first.tasks, again.tasks, strict=True))
    other = tmp_path / "other.safetensors"  # another weights file: another key, features computed again
    from safetensors.torch import load_file

    state = load_file(str(weights))
    save_file({**state, "norm.bias": state["norm.bias"] + 1}, str(other))
    feature_stream(from_dict(config(tmp_path, weights=str(other))), raw, torch.device("cpu"))
    assert "computed in" in capsys.readouterr().err
    resized = from_dict(config(tmp_path, weights=str(weights), image_size=48))  # preprocessing: position embeddings
    feature_stream(resized, raw, torch.device("cpu"))                           # resampled, another key
    assert "computed in" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["fedavg", "afcl", "ranpac"])
def test_run_from_a_weights_file_resumes_bit_identically(weights, tmp_path, monkeypatch, method):
    spec = {"name": method, **({"projection_dim": 256} if method == "ranpac" else {})}  # its W_rand: regenerated
    cfg = from_dict({**config(tmp_path, weights=str(weights)), "method": spec, "checkpoint_every": 1})
    full, resumed = killed_and_resumed(cfg, tmp_path, monkeypatch)  # killed after round 3's checkpoint
    assert full["backbone"]["sha256"] == sha256_of(weights) and full["random_backbone"] is False
    assert full["method"] == method and full["acc"] > 50
    assert resumed["acc_matrix"] == full["acc_matrix"]
    assert resumed["upload_bytes"] == full["upload_bytes"] and resumed["download_bytes"] == full["download_bytes"]
    final, reference = checkpointed_params(tmp_path / "part"), checkpointed_params(tmp_path / "full")
    assert all(torch.equal(final[k], reference[k]) for k in reference)


def test_random_backbone_is_flagged(tmp_path):
    from cfl.app.single_run import execute
    from cfl.report.wandb_names import shown_method

    cfg = from_dict({**config(tmp_path, weights="random"), "rounds_per_task": 1, "method": {"name": "fedncm"}})
    results = execute(cfg, tmp_path / "run", quiet=True)
    assert results["random_backbone"] is True and results["backbone"]["random"] is True
    assert results["method"] == "fedncm (random backbone)"
    assert json.loads((tmp_path / "run" / "results.json").read_text())["method"] == "fedncm (random backbone)"
    assert shown_method(cfg).endswith("(random backbone)")
    from cfl.report.labels import run_title

    assert "(random backbone)" in run_title(results)
