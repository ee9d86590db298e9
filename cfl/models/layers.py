"""Which weights are 'layers' in the GPM/FOT sense: linear and conv weights, never heads per task."""

from __future__ import annotations

from torch import nn

from cfl.heads import MultiHead


def protected_layers(model: nn.Module) -> dict[str, str]:
    """``{param name: "linear" | "conv"}`` for every linear/conv weight except per-task heads.

    Biases and normalisation parameters are never included; a single shared output layer is; a frozen layer (its
    weight a buffer: a pretrained backbone's, cfl/pretrained/adapted.py) is not.
    """
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, MultiHead) or not isinstance(getattr(module, "weight", None), nn.Parameter):
            continue
        if isinstance(module, nn.Linear):
            out[f"{name}.weight"] = "linear"
        elif isinstance(module, nn.Conv2d):
            out[f"{name}.weight"] = "conv"
    return out
