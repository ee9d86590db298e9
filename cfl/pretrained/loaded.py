"""The run's backbone built and its weights loaded once per process (the config check and the feature stream
share it), and the config keys checked: every refusal happens when the config is validated, before any data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cfl.config.adapter_keys import ADAPTER_KEYS
from cfl.config.schema import ConfigError
from cfl.pretrained.backbones import BACKBONES, build_backbone, is_backbone, require_timm
from cfl.pretrained.preprocessing import Preprocessing, of_backbone
from cfl.pretrained.weights import RANDOM, LoadedWeights, load_weights, sha256_of

#: the stream.info key (and results.json field) of the backbone a run uses
INFO_KEY = "backbone"


@dataclass(frozen=True)
class LoadedBackbone:
    name: str
    model: nn.Module
    weights: LoadedWeights
    preprocessing: Preprocessing
    image_size: int | None
    seed: int | None  # the seed of a random backbone's initialisation (None: weights from a file)

    def describe(self) -> dict[str, Any]:
        """The backbone as results.json records it."""
        untrained = {} if self.weights.untrained is None else {"untrained": self.weights.untrained}
        return {"name": self.name, "timm": BACKBONES[self.name].timm_name, "weights": self.weights.path or RANDOM,
                "sha256": self.weights.sha256, "random": self.weights.random,
                "preprocessing": self.preprocessing.as_dict(), "random_init_seed": self.seed, **untrained}


_LOADED: dict[tuple, LoadedBackbone] = {}


def _key(cfg: Any) -> tuple:
    """The memo's key: the file's SHA-256 (read in full: a file replaced by one of the same size and modification
    time is another file), or a random backbone's seed."""
    model = cfg.model
    digest = None
    if model.weights not in (None, RANDOM) and Path(model.weights).expanduser().is_file():
        digest = sha256_of(Path(model.weights).expanduser())
    seed = cfg.seed if model.weights == RANDOM else None
    return (model.name, model.image_size, model.weights, model.weights_sha256, model.weights_trained, digest, seed)


def untrained(cfg: Any) -> bool:
    """Whether the run's backbone is untrained (``weights: random``, or a file flagged as freshly initialised)."""
    weights = cfg.model.weights
    if not is_backbone(cfg.model.name) or weights is None:
        return False
    if weights == RANDOM:
        return True
    return Path(weights).expanduser().is_file() and loaded_backbone(cfg).weights.random  # a missing file: refused


def loaded_backbone(cfg: Any) -> LoadedBackbone:
    """The backbone of ``cfg`` with its weights (a random one initialised from the run seed), in eval mode;
    the last one built is kept for the next call with the same keys and file."""
    key = _key(cfg)
    if key in _LOADED:
        return _LOADED[key]
    model_cfg = cfg.model
    require_timm()
    seed = cfg.seed if model_cfg.weights == RANDOM else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if seed is None else seed)
        try:
            model = build_backbone(model_cfg.name, model_cfg.image_size)
        except (ValueError, AssertionError, RuntimeError) as err:
            raise ConfigError(f"model {model_cfg.name} cannot be built with model.image_size "
                              f"{model_cfg.image_size}: {err}") from None
    weights = load_weights(model, model_cfg.weights, model_cfg.weights_sha256, quiet=True,  # notes: in the run output
                           trained=model_cfg.weights_trained)
    model.eval().requires_grad_(False)
    loaded = LoadedBackbone(model_cfg.name, model, weights, of_backbone(model, model_cfg.image_size),
                            model_cfg.image_size, seed)
    _LOADED.clear()  # one backbone held at a time (a ViT-B/16 is 350 MB)
    _LOADED[key] = loaded
    return loaded


def resolved_prompt_length(model: Any) -> int | None:
    """``model.prompt_length``, null resolved to the official code's for ``model.train`` (None where unread)."""
    if model.prompt_length is not None or model.train not in ("prompts", "components", "task-components",
                                                              "dual-prompts"):
        return model.prompt_length
    return 8 if (model.train == "components" and model.component_layers) or model.train == "task-components" else 5


def _default(key: str) -> Any:
    from cfl.config.keys import ModelConfig

    f = ModelConfig.__dataclass_fields__[key]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def check_adapter_keys(model: Any) -> None:
    """The adapter keys of another ``model.train`` than the run's are refused when set; top_k within the pool."""
    read = ADAPTER_KEYS.get(model.train, ())
    unread = sorted({k for keys in ADAPTER_KEYS.values() for k in keys if k not in read
                     and getattr(model, k) != _default(k)})
    if unread:
        raise ConfigError(f"{', '.join(f'model.{k}' for k in unread)} is read only under another model.train "
                          f"(model.train is {model.train}): remove it, or set model.train")
    width = BACKBONES[model.name].features if is_backbone(model.name) else None
    if model.train == "lora" and width is not None and model.lora_rank > width:
        raise ConfigError(f"model.lora_rank {model.lora_rank} exceeds the width {width} of {model.name}'s attention "
                          f"qkv projections ({width} -> {3 * width}): an update B A of that rank has rank at most "
                          f"{width}, the extra factors only add parameters; set lora_rank at most {width}")
    depth = BACKBONES[model.name].depth if is_backbone(model.name) else None
    if model.train == "dual-prompts" and depth is not None and model.g_prompt_layers + model.e_prompt_layers > depth:
        raise ConfigError(f"model.g_prompt_layers {model.g_prompt_layers} + e_prompt_layers {model.e_prompt_layers} "
                          f"exceed {model.name}'s {depth} blocks; lower them (the official 2 + 3)")
    if model.train == "lora" and depth is not None and model.lora_layers > depth:
        raise ConfigError(f"model.lora_layers {model.lora_layers} exceeds {model.name}'s {depth} blocks; lower it "
                          "(0: every block; PILoRA's code: 1)")
    if model.train == "components" and depth is not None and model.component_layers > depth:
        raise ConfigError(f"model.component_layers {model.component_layers} exceeds {model.name}'s {depth} blocks; "
                          "lower it (the official 5)")
    if model.train == "components" and model.component_layers and model.prompt_length % 2:
        raise ConfigError(f"model.component_layers {model.component_layers} prefixes the attention with each prompt's "
                          f"key and value halves: model.prompt_length {model.prompt_length} is odd; set an even "
                          "prompt_length (the official 8), or component_layers: 0 (prompt tuning)")
    blocks = model.prompt_blocks
    if model.train == "task-components" and depth is not None and (
            not blocks or blocks != sorted(set(blocks)) or blocks[0] < 0 or blocks[-1] >= depth):
        raise ConfigError(f"model.prompt_blocks {blocks} must be distinct block indices of {model.name} (0 to "
                          f"{depth - 1}) in increasing order (Powder's official [4, 5, 6])")
    if model.train in ("prompts", "dual-prompts") and model.prompt_top_k > model.prompt_pool:
        raise ConfigError(f"model.prompt_top_k {model.prompt_top_k} selects more prompts than the pool holds "
                          f"(model.prompt_pool {model.prompt_pool}); lower prompt_top_k or raise prompt_pool")


def check_method_train(cfg: Any, trains: dict[str, str]) -> None:
    """Each method's ``model_train`` (``trains``: method name -> its ``Method.requires.model_train``, "" for any)
    against ``model.train``; the prompt pool's keys train only through L2P's surrogate loss, so ``model.train: prompts``
    needs a method that declares it."""
    names = [cfg.method["name"], *[p["name"] for p in cfg.plugins]]
    train = cfg.model.train
    for name in names:
        needed = trains.get(name, "")
        if needed and needed != train:
            raise ConfigError(f"method {name} needs model.train: {needed}; the config has model.train: {train}")
    if train == "prompts" and not any(trains.get(name) == "prompts" for name in names):
        raise ConfigError("model.train: prompts trains a prompt pool whose keys learn only from a prompt method's "
                          "key-query loss; use method l2p (or set model.train: lora, all or head)")
    if train == "dual-prompts" and not any(trains.get(name) == train for name in names):
        raise ConfigError("model.train: dual-prompts trains DualPrompt's E-prompts, whose keys learn only from its "
                          "key-query loss; use method dualprompt (or set model.train: prompts, lora, all or head)")
    if train == "components" and not any(trains.get(name) == train for name in names):
        raise ConfigError("model.train: components trains CODA-P's prompt components; use method codap or "
                          "fedcprompt (or set model.train: prompts, lora, all or head)")
    if train == "task-components" and not any(trains.get(name) == train for name in names):
        raise ConfigError("model.train: task-components composes each task's prompt from the task correlation that "
                          "only Powder's server computes; use method powder (or set model.train: components, "
                          "prompts, lora, all or head)")


def check_backbone(cfg: Any, trains: dict[str, str], read_weights: bool = True) -> None:
    """The ``model.weights`` keys against the model: a pretrained backbone needs weights (a file, checked and
    loaded here unless ``read_weights`` is False, or random); other models take none. ``trains``:
    :func:`check_method_train`'s."""
    model = cfg.model
    if not is_backbone(model.name):
        given = [k for k in ("weights", "weights_sha256", "weights_origin", "image_size")
                 if getattr(model, k) is not None]
        if model.weights_trained:
            given.append("weights_trained")
        if model.train != "head":
            given.append("train")
        adapter_keys = dict.fromkeys(k for keys in ADAPTER_KEYS.values() for k in keys)  # each key once
        given += [k for k in adapter_keys if getattr(model, k) != _default(k)]
        if given:
            keys = ", ".join(f"'model.{k}'" for k in given)
            verb, them = ("is", "it") if len(given) == 1 else ("are", "them")
            raise ConfigError(f"{keys} {verb} read only by the pretrained backbones ({', '.join(BACKBONES)}); model "
                              f"{model.name} trains from scratch: remove {them}")
        return
    from cfl.data.stream_registry import STREAMS

    shape = tuple(STREAMS[cfg.stream.name].input_shape)
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise ConfigError(f"model {model.name} takes images (1 or 3 channels, resized to its input size); stream "
                          f"'{cfg.stream.name}' gives inputs of shape {shape}")
    if model.weights is None:
        raise ConfigError(f"model {model.name} needs 'model.weights': a local weights file (.safetensors, .pth or "
                          f".npz; docs/pretrained.md says how to get one) or 'random' (an untrained backbone, for "
                          f"testing the mechanics only; flagged in every output)")
    if model.weights_origin is not None and (model.weights == RANDOM or not model.weights_origin.strip()):
        problem = ("weights: random is flagged '(random backbone)' already" if model.weights == RANDOM
                   else "it is empty")
        raise ConfigError(f"'model.weights_origin' {model.weights_origin!r}: {problem}; remove the key")
    check_adapter_keys(model)
    check_method_train(cfg, trains)
    if model.weights_sha256 is not None and (len(model.weights_sha256) != 64
                                             or any(c not in "0123456789abcdefABCDEF" for c in model.weights_sha256)):
        raise ConfigError(f"'model.weights_sha256' must be 64 hex digits (sha256sum's output), got "
                          f"{model.weights_sha256!r}")
    if read_weights or model.weights == RANDOM:
        loaded_backbone(cfg)
