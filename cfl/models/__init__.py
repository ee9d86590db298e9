"""Model registry: name -> builder taking the stream's :class:`ModelShape`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from cfl.models.alexnet import AlexNetLike
from cfl.models.feature_head import FeatureHead
from cfl.models.fedweit_net import FedWeITLeNet, FedWeITMLP
from cfl.models.mlp import MLP
from cfl.models.resnet import ReducedResNet18
from cfl.pretrained.backbones import BACKBONES, EXTRA
from cfl.registry import Registry


@dataclass(frozen=True)
class ModelShape:
    """What a model must fit: input shape, classes per head, number of tasks, heads layout."""

    input_shape: tuple[int, ...]
    classes: int
    num_tasks: int
    multi_head: bool
    clients_per_round: int = 1  # FedWeIT's knowledge base holds one entry per client of a round


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


def _image(shape: ModelShape) -> tuple[int, int]:
    if len(shape.input_shape) != 3 or shape.input_shape[1] != shape.input_shape[2]:
        raise ValueError(f"this model needs square (C, H, W) images, the stream gives {shape.input_shape}")
    return shape.input_shape[0], shape.input_shape[1]


def _alexnet(shape: ModelShape) -> nn.Module:
    return AlexNetLike(*_image(shape), shape.classes, shape.num_tasks, shape.multi_head)


def _resnet18_reduced(shape: ModelShape) -> nn.Module:
    return ReducedResNet18(*_image(shape), shape.classes, shape.num_tasks, shape.multi_head, nf=20, stem_stride=1,
                           batch_norm="none")


def _resnet18_mini(shape: ModelShape) -> nn.Module:
    return ReducedResNet18(*_image(shape), shape.classes, shape.num_tasks, shape.multi_head, nf=32, stem_stride=2,
                           batch_norm="batch")


def _resnet18_reduced_running_bn(shape: ModelShape) -> nn.Module:
    return ReducedResNet18(*_image(shape), shape.classes, shape.num_tasks, shape.multi_head, nf=20, stem_stride=1,
                           batch_norm="running")


def _fedweit_mlp(shape: ModelShape) -> nn.Module:
    return FedWeITMLP(_numel(shape.input_shape), [256, 256], shape.classes, shape.num_tasks, shape.clients_per_round,
                      shape.multi_head)


def _fedweit_lenet(shape: ModelShape) -> nn.Module:
    return FedWeITLeNet(*_image(shape), shape.classes, shape.num_tasks, shape.clients_per_round, shape.multi_head)


def _feature_head(name: str) -> Callable[[ModelShape], nn.Module]:
    """A pretrained backbone's model: the head on its cached features (cfl/pretrained/features.py gives the run
    a stream of ``(D,)`` feature vectors in place of its images)."""
    width = BACKBONES[name].features

    def build(shape: ModelShape) -> nn.Module:
        if shape.input_shape != (width,):
            raise ValueError(f"model {name} trains a head on the frozen backbone's cached {width}-wide features, "
                             f"not on inputs {shape.input_shape} (model.train: head; docs/pretrained.md)")
        return FeatureHead(width, shape.classes, shape.num_tasks, shape.multi_head)
    return build


ModelBuilder = Callable[[ModelShape], nn.Module]

MODELS: Registry[ModelBuilder] = Registry("model")
MODELS.register("mlp", _mlp, about="MLP 784-400-400-400 with dropout 0.2/0.5/0.5 (FOT Permuted-MNIST reference)")
MODELS.register("digits-mlp", _digits_mlp, about="MLP in-128-128, no dropout (small streams such as 8x8 digits)")
MODELS.register("alexnet", _alexnet,
                about="AlexNet-like, 3 convs + 2 fc 2048, dropout, no biases (Split CIFAR-100 reference)")
MODELS.register("resnet18-reduced", _resnet18_reduced,
                about="reduced ResNet-18, 20 base filters, no BatchNorm (5-Datasets)")
MODELS.register("resnet18-mini", _resnet18_mini,
                about="reduced ResNet-18, 32 base filters, stride-2 stem, batch-stat BatchNorm (Mini-ImageNet)")
MODELS.register("resnet18-reduced-running-bn", _resnet18_reduced_running_bn,
                about="reduced ResNet-18, 20 base filters, BatchNorm with running statistics (buffers carried by the "
                      "engine: model.buffers; TARGET/MFCL's BN-statistics matching)")

#: FedWeIT's networks (method fedweit only: any other method would average their per-client parts)
MODELS.register("fedweit-mlp", _fedweit_mlp,
                about="FedWeIT's decomposed MLP in-256-256, one head per task (method fedweit only)")
MODELS.register("fedweit-lenet", _fedweit_lenet,
                about="FedWeIT's decomposed LeNet (conv 20, 50, fc 800, 500; the official code's; method fedweit only)")

#: pretrained backbones from timm, frozen; a weights file from model.weights (docs/pretrained.md)
for _name, _backbone in BACKBONES.items():
    MODELS.register(_name, _feature_head(_name),
                    about=f"{_backbone.about}, timm {_backbone.timm_name}, frozen: a head on its cached features; "
                          f"needs model.weights (a local file, or random) and the extra pretrained ({EXTRA})")


def build_model(name: str, shape: ModelShape) -> nn.Module:
    """The model ``name`` built for ``shape`` (an unknown name: :class:`cfl.registry.UnknownName`)."""
    return MODELS[name](shape)


def run_model(cfg: Any, stream: Any, shape: ModelShape) -> nn.Module:
    """The run's model: the registry's (``model.name``, or ``auto``: the stream's), or for a pretrained backbone
    trained through it (``model.train`` prompts, lora or all) the adapted backbone (cfl/pretrained/adapted.py)."""
    name = cfg.model.name if cfg.model.name != "auto" else stream.default_model
    if name in BACKBONES and cfg.model.train != "head":
        from cfl.pretrained.adapted import adapted_model
        from cfl.pretrained.queries import layout_of

        return adapted_model(cfg, shape.classes, shape.num_tasks, shape.multi_head,
                             layout=layout_of(getattr(stream, "info", {})))
    return build_model(name, shape)
