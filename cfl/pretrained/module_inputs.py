"""The inputs that named submodules of a model see over a client's samples, without gradients: what LoRM's
RegMean Grams (``X^T X`` of each LoRA layer's inputs) and PILoRA's class prototypes (the head's input features)
are made of. The model runs at ``params`` (``torch.func.functional_call``) in batches of ``batch`` samples, each
with the client's task id; a forward hook hands each named module's first input to ``visit`` as it is made (so
nothing of a batch is kept beyond what ``visit`` keeps), and the hooks are removed on the way out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

#: samples of one forward pass (memory: a ViT-B/16 at 224 px holds ~200 MB of activations for 128 samples)
BATCH = 128


def visit_module_inputs(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, task: int,
                        names: list[str], visit: Callable[[str, torch.Tensor], None], batch: int = BATCH) -> None:
    """Call ``visit(name, input)`` with the detached input of each module of ``names`` at every call of it, the
    batches of ``x`` in order."""
    modules = dict(model.named_modules())

    def hook(name: str) -> Any:
        def seen(_module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
            visit(name, inputs[0].detach())
        return seen

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        tasks = torch.full((len(x),), task, dtype=torch.long, device=x.device)
        with torch.no_grad():
            for start in range(0, len(x), batch):
                functional_call(model, params, (x[start:start + batch], tasks[start:start + batch]))
    finally:
        for h in handles:
            h.remove()
