"""The features a model's ``head`` sees (the penultimate layer, iCaRL's feature extractor) and its logits, for
exemplar selection and prototypes (GLFC). Every built-in model ends in ``head(features, task)``."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from cfl.ops.distill import evaluating
from cfl.tensors import Params


def head_features(model: nn.Module, params: Params, x: torch.Tensor, task: int,
                  chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (n, d), logits (n, K))`` of ``x`` under ``params`` (the template ``model`` in eval mode, no
    gradients, ``chunk`` samples at a time); ``features`` is the input of ``model.head``."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no 'head' module, whose input would be the features; "
                         "give the model a head(features, task) as the built-in models have")
    captured: list[torch.Tensor] = []
    handle = head.register_forward_pre_hook(lambda _module, args: captured.append(args[0].detach()))
    logits = []
    try:
        with evaluating(model), torch.no_grad():
            for start in range(0, len(x), chunk):
                xb = x[start: start + chunk]
                logits.append(functional_call(model, params, (xb, torch.full((len(xb),), task, device=x.device))))
    finally:
        handle.remove()
    return torch.cat(captured).flatten(1), torch.cat(logits)
