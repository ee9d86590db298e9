"""The input matrix of every protected layer, as GPM (Saha et al. 2021) and FOT (Bakman et al. 2024) use it.

For a linear layer the columns are the layer's input vectors (d = in_features); for a conv layer they are
the im2col patches of its input with the layer's own padding, stride and dilation, one column per output
position, in the order of ``weight.view(C_out, -1)`` (d = C_in * kh * kw). Then ``W A`` is the layer's
pre-activation output (bias aside) for every column, which is what the projections keep fixed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from cfl.tensors import Params


def conv_patches(module: nn.Conv2d, inputs: torch.Tensor) -> torch.Tensor:
    """im2col patches of ``inputs`` (B, C, H, W) for ``module``: (C * kh * kw, B * L), L output positions."""
    if module.groups != 1:
        raise ValueError(f"grouped convolutions (groups={module.groups}) have no single input matrix")
    padding = module.padding
    if module.padding_mode != "zeros" or isinstance(padding, str):
        inputs = F.pad(inputs, module._reversed_padding_repeated_twice,
                       mode="constant" if module.padding_mode == "zeros" else module.padding_mode)
        padding = 0
    cols = F.unfold(inputs, module.kernel_size, dilation=module.dilation, padding=padding, stride=module.stride)
    return cols.transpose(0, 1).reshape(cols.shape[1], -1)  # (d, B, L) -> (d, B*L), sample-major columns


def linear_inputs(inputs: torch.Tensor) -> torch.Tensor:
    """Input vectors of a linear layer (..., d) as columns: (d, n)."""
    return inputs.reshape(-1, inputs.shape[-1]).T


def _owners(model: nn.Module, protected: dict[str, str]) -> dict[str, nn.Module]:
    modules = dict(model.named_modules())
    owners = {}
    for name, kind in protected.items():
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        module = modules.get(owner)
        expected = nn.Conv2d if kind == "conv" else nn.Linear
        if not isinstance(module, expected):
            raise ValueError(f"protected parameter '{name}' ({kind}) is not the weight of an nn.{expected.__name__}")
        owners[name] = module
    return owners


def iter_layer_inputs(model: nn.Module, params: Params, x: torch.Tensor, task: int, protected: dict[str, str],
                      chunk: int = 256, train_mode: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """Yield ``{param name: (d, n_chunk) input matrix}`` for successive chunks of ``chunk`` samples of ``x``.

    ``model`` is a template module run with ``params`` (``torch.func.functional_call``) and its own buffers,
    in eval mode (``train_mode=False``: dropout off, running BatchNorm statistics), without gradients.
    """
    owners = _owners(model, protected)
    captured: dict[str, torch.Tensor] = {}

    def hook_for(name: str, kind: str):
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:  # noqa: ARG001
            captured[name] = conv_patches(module, args[0]) if kind == "conv" else linear_inputs(args[0])
        return hook

    handles = [owners[n].register_forward_hook(hook_for(n, k)) for n, k in protected.items()]
    buffers = dict(model.named_buffers())
    was_training = model.training
    model.train(train_mode)
    try:
        with torch.no_grad():
            for start in range(0, len(x), chunk):
                xb = x[start: start + chunk]
                captured.clear()
                functional_call(model, (params, buffers), (xb, torch.full((len(xb),), task, device=xb.device)))
                yield dict(captured)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


def layer_grams(model: nn.Module, params: Params, x: torch.Tensor, task: int, protected: dict[str, str],
                chunk: int = 256, train_mode: bool = False) -> dict[str, torch.Tensor]:
    """``{param name: A A^T}`` (d x d, float64) accumulated chunk by chunk: memory stays O(d^2)."""
    grams: dict[str, torch.Tensor] = {}
    for block in iter_layer_inputs(model, params, x, task, protected, chunk, train_mode):
        for n, a in block.items():
            a = a.double()
            grams[n] = grams[n] + a @ a.T if n in grams else a @ a.T
    return grams


@dataclass
class HeldInputs:
    """One layer's inputs on one client: ``A`` itself (d x n, float64) while n < d, else ``A A^T`` (d x d)."""

    matrix: torch.Tensor
    is_gram: bool

    def add(self, block: torch.Tensor) -> HeldInputs:
        """These inputs with the columns ``block`` appended; turned into the Gram once ``n >= d``."""
        block = block.double()
        if self.is_gram:
            return HeldInputs(self.matrix + block @ block.T, True)
        return HeldInputs.of(torch.cat([self.matrix, block], 1))

    @staticmethod
    def of(inputs: torch.Tensor) -> HeldInputs:
        """``inputs`` (d x n) held as they are if ``n < d``, else as their Gram."""
        inputs = inputs.double()
        if inputs.shape[1] < inputs.shape[0]:
            return HeldInputs(inputs, False)
        return HeldInputs(inputs @ inputs.T, True)


def layer_inputs_or_grams(model: nn.Module, params: Params, x: torch.Tensor, task: int, protected: dict[str, str],
                          chunk: int = 256, train_mode: bool = False) -> dict[str, HeldInputs]:
    """``{param name: A}`` for layers with fewer input columns than d (a client with few samples), else
    ``A A^T`` accumulated chunk by chunk as in :func:`layer_grams`: memory stays O(d * (d + chunk))."""
    held: dict[str, HeldInputs] = {}
    for block in iter_layer_inputs(model, params, x, task, protected, chunk, train_mode):
        for n, a in block.items():
            held[n] = held[n].add(a) if n in held else HeldInputs.of(a)
    return held
