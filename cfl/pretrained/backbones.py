"""The pretrained backbones cfl knows: cfl name -> timm architecture, built without any download
(``pretrained=False``); timm is an optional extra (``pip install -e ".[pretrained]"`` in the checkout)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from torch import nn

from cfl.config.schema import ConfigError
from cfl.distribution import extra_install

EXTRA = extra_install("pretrained")


@dataclass(frozen=True)
class Backbone:
    """A timm architecture, the width of its pooled features and its number of blocks."""

    timm_name: str
    features: int
    about: str
    depth: int = 12


BACKBONES: dict[str, Backbone] = {
    "vit-ti16": Backbone("vit_tiny_patch16_224", 192, "ViT-Ti/16 (5.5 M parameters)"),
    "vit-s16": Backbone("vit_small_patch16_224", 384, "ViT-S/16 (22 M parameters)"),
    "vit-b16": Backbone("vit_base_patch16_224", 768, "ViT-B/16 (86 M parameters; the FCL papers' backbone)"),
}


def is_backbone(model_name: str) -> bool:
    return model_name in BACKBONES


def timm_missing() -> str | None:
    """Why timm cannot be used here (None: it can)."""
    for module in ("timm", "safetensors"):
        if importlib.util.find_spec(module) is None:
            return f"the pretrained backbones need the packages timm and safetensors ({EXTRA}); {module} is missing"
    return None


def require_timm() -> Any:
    """The ``timm`` module, or ConfigError saying how to install it."""
    missing = timm_missing()
    if missing:
        raise ConfigError(missing)
    import timm

    return timm


def build_backbone(name: str, image_size: int | None) -> nn.Module:
    """The timm architecture of ``name`` without a classifier (``num_classes=0``: pooled features), randomly
    initialised, never downloading; ``image_size`` (None: the architecture's own) sizes its position embeddings."""
    timm = require_timm()
    extra = {} if image_size is None else {"img_size": image_size}
    return timm.create_model(BACKBONES[name].timm_name, pretrained=False, num_classes=0, **extra)
