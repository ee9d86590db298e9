"""Reference implementations that the tests compare cfl's code against (not used by cfl itself)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from cfl.ops.aggregate import agreement_mask, weighted_mean
from cfl.ops.layer_inputs import iter_layer_inputs
from cfl.tensors import Params


def gradient_masked_mean(deltas: Params, weights: torch.Tensor, tau: float) -> Params:
    """GMA for FedAvg (Tenison et al. 2023, Algorithm 1): ``m * sum_n D_n``; ``tau = 0`` is plain averaging."""
    mean, mask = weighted_mean(deltas, weights), agreement_mask(deltas, weights, tau)
    return {k: mask[k] * mean[k] for k in mean}


def layer_inputs(model: nn.Module, params: Params, x: torch.Tensor, task: int, protected: dict[str, str],
                 chunk: int = 256, train_mode: bool = False) -> Params:
    """All chunks of :func:`cfl.ops.layer_inputs.iter_layer_inputs` concatenated: ``{param name: (d, n)}``."""
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in protected}
    for block in iter_layer_inputs(model, params, x, task, protected, chunk, train_mode):
        for n, a in block.items():
            parts[n].append(a)
    return {n: torch.cat(p, 1) for n, p in parts.items() if p}


class TwoLayerNet(nn.Module):
    """Bias-free ``in -> hidden -> out`` ReLU net (as GPM's MLP), so projected weight steps are the only change."""

    def __init__(self, inputs: int = 8, hidden: int = 6, outputs: int = 3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, outputs, bias=False)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return self.fc2(torch.relu(self.fc1(x)))


class BatchStatNet(nn.Module):
    """conv -> BatchNorm with batch statistics only (as the Mini-ImageNet ResNet) -> linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2, track_running_stats=False)
        self.head = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: torch.Tensor, task: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def load_plugin_file(path: Path) -> ModuleType:
    """Import a plugin file (e.g. one of docs/examples/) as a fresh module, as ``--plugin`` does."""
    spec = importlib.util.spec_from_file_location(f"cfl_plugin_{path.stem}_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def benchmark_module(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (a script, not a package module) as a fresh module."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Records:
    """A runner observer keeping each round's record."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []

    def round_end(self, record: dict) -> None:
        self.rounds.append(record)

    def evaluation(self, record: dict) -> None: ...
    def task_end(self, task: int, record: dict) -> None: ...


def metrics_values(path: Path) -> list[str]:
    """A ``metrics.jsonl``'s lines, each less its timings (``seconds``, ``wall_seconds``) and written again as
    JSON text (NaN compares equal as text): a resumed run's lines equal an uninterrupted run's in every other
    value, to the last digit."""
    import json

    from cfl.report.jsonl import without_timing

    return [json.dumps(without_timing(json.loads(line))) for line in path.read_text().splitlines()]


def tiny_vit_runner(cfg):  # noqa: ANN001, ANN201
    """A Runner of ``cfg`` (a random ViT-Ti/16 at 16 px: one patch) on 2 class-incremental tasks of 3 x 8 x 8
    images, 24 training samples each."""
    from cfl.engine.rounds.runner import Runner
    from cfl.pretrained.features import with_backbone
    from tests.conftest import make_stream

    stream = make_stream("class", num_tasks=2, image=(1, 8, 8), n_train=24, n_test=8)
    return Runner(cfg, with_backbone(cfg, stream, torch.device("cpu"), quiet=True))
