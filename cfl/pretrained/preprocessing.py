"""What a backbone expects of its inputs, from its timm ``pretrained_cfg`` (size, mean/std, interpolation), and a
stream's images brought to it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

#: timm's interpolation names -> torch's ``interpolate`` modes
MODES = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest"}


@dataclass(frozen=True)
class Preprocessing:
    """Inputs of ``size`` x ``size`` pixels, 3 channels, normalised by ``mean``/``std`` after resizing with
    ``interpolation``; part of the feature cache's key."""

    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def of_backbone(model: torch.nn.Module, image_size: int | None) -> Preprocessing:
    """The backbone's pretrained config (its input size unless ``image_size`` is given)."""
    cfg = model.pretrained_cfg
    size = image_size if image_size is not None else int(cfg["input_size"][-1])
    interpolation = cfg.get("interpolation", "bicubic")
    if interpolation not in MODES:
        raise ValueError(f"interpolation {interpolation!r} of the backbone's pretrained config is not one of "
                         f"{sorted(MODES)}")
    return Preprocessing(size, tuple(float(v) for v in cfg["mean"]), tuple(float(v) for v in cfg["std"]),
                         interpolation)


def unit_range(train: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel, the min and max over ``train`` (``(N, C, H, W)`` tensors): cfl's streams hold standardised
    inputs, and this affine map takes them back to [0, 1] (exact for streams standardised by one affine map per
    channel of pixels that span 0..255, e.g. the bundled digits, MNIST-like and CIFAR streams)."""
    low = torch.stack([x.amin(dim=(0, 2, 3)) for x in train]).amin(0)
    high = torch.stack([x.amax(dim=(0, 2, 3)) for x in train]).amax(0)
    return low, torch.where(high > low, high, low + 1)


def prepared(x: torch.Tensor, pre: Preprocessing, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``x`` ``(N, C, H, W)`` (C 1 or 3) -> ``(N, 3, size, size)`` in the backbone's normalisation: to [0, 1]
    per channel (``low``, ``high``), resized, grayscale repeated to 3 channels, normalised."""
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"a pretrained backbone takes images (N, 1 or 3, H, W); the stream gives {tuple(x.shape)}")
    x = (x - low.view(1, -1, 1, 1)) / (high - low).view(1, -1, 1, 1)
    if x.shape[-1] != pre.size or x.shape[-2] != pre.size:
        mode = MODES[pre.interpolation]
        x = F.interpolate(x, size=(pre.size, pre.size), mode=mode,
                          **({} if mode == "nearest" else {"align_corners": False}))
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    mean = torch.tensor(pre.mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(pre.std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std
