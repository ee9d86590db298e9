"""The global model as a module, for the server hooks that need one (``Method.server_event``): a copy of the
run's template holding the global parameters. Every such hook gets its model from :func:`global_model`, so what
the global model holds besides its parameters (BatchNorm running statistics) is
loaded in this one place."""

from __future__ import annotations

import copy

import torch
from torch import nn

from cfl.models.buffers import load_global_model
from cfl.tensors import Params


def global_model(template: nn.Module, params: Params, buffers: Params) -> nn.Module:
    """A copy of ``template`` (the caller's stays as it is) holding ``params`` and ``buffers`` (BatchNorm running
    statistics; ``{}`` for a model without any), in eval mode."""
    model = copy.deepcopy(template)
    own = dict(model.named_parameters())
    if set(own) != set(params):
        raise ValueError(f"the global parameters {sorted(params)} are not the template's {sorted(own)}")
    with torch.no_grad():
        for k, p in own.items():
            p.copy_(params[k])
    return load_global_model(model, {}, buffers).eval()
