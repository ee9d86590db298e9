"""Model registry: name -> builder taking the stream's :class:`ModelShape`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from cfl.models.mlp import MLP


@dataclass(frozen=True)
class ModelShape:
    """What a model must fit: input shape, classes per head, number of tasks, heads layout."""

    input_shape: tuple[int, ...]
    classes: int
    num_tasks: int
    multi_head: bool


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _mlp(shape: ModelShape) -> nn.Module:
    return MLP(_numel(shape.input_shape), [400, 400, 400], shape.classes, shape.num_tasks,
               shape.multi_head, dropouts=[0.2, 0.5, 0.5])


def _digits_mlp(shape: ModelShape) -> nn.Module:
    return MLP(_numel(shape.input_shape), [128, 128], shape.classes, shape.num_tasks, shape.multi_head)


MODELS: dict[str, tuple[Callable[[ModelShape], nn.Module], str]] = {
    "mlp": (_mlp, "MLP 784-400-400-400 with dropout 0.2/0.5/0.5 (FOT Permuted-MNIST reference)"),
    "digits-mlp": (_digits_mlp, "MLP in-128-128, no dropout (small streams such as 8x8 digits)"),
}


def build_model(name: str, shape: ModelShape) -> nn.Module:
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}'; available: {', '.join(MODELS)}")
    return MODELS[name][0](shape)
