"""The pretrained-backbone table: its sweep's rows and labels, and every command docs/results.md
gives for reproducing the published settings with real weights validates (with ``model.weights: random``: no
weight file here). Needs the pretrained extra (timm)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cfl.app.sweep import load_sweep
from cfl.pretrained.backbones import timm_missing
from cfl.validation import load_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(timm_missing() is not None, reason="needs the extra pretrained (timm)")


def documented_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "results.md").read_text()
    return [shlex.split(line) for line in re.findall(r"^cfl run configs/pretrained-\S+.*$", text, re.M)]


def test_the_sweep_has_every_row_on_both_streams_with_a_random_vit_at_224(tmp_path):
    runs = load_sweep(ROOT / "benchmarks" / "pretrained" / "split-3x224.yaml", out=tmp_path)
    labels = list(dict.fromkeys(r.config.label for r in runs))
    assert labels[:7] == ["linear-probe", "full-fine-tune", "fedncm", "afcl", "l2p", "codap", "lora"]
    assert labels[7:] == ["lorm", "fedcprompt", "ranpac", "dualprompt"]
    assert {r.config.stream.name for r in runs} == {"split-digits", "split-fmnist"}
    assert len(runs) == len(labels) * 2 * 3  # every row on both streams, 3 seeds
    for run in runs:
        assert run.config.model.name == "vit-ti16" and run.config.model.weights == "random"
        assert run.config.model.image_size is None and run.config.stream.scenario == "class"  # 224: the default


@pytest.mark.parametrize("command", documented_commands(), ids=lambda c: " ".join(c[2:3] + c[-4:]))
def test_each_documented_command_validates(command):
    config, sets = command[2], [command[i + 1] for i, word in enumerate(command) if word == "--set"]
    assert command[:2] == ["cfl", "run"] and any(s.startswith("model.weights=") for s in sets)
    sets = [("model.weights=random" if s.startswith("model.weights=") else s) for s in sets]
    cfg = load_config(ROOT / config, sets)
    assert cfg.model.name == "vit-b16" and cfg.partition.name == "dirichlet" and cfg.stream.num_tasks == 10


def test_the_commands_cover_every_pretrained_method_on_both_streams():
    from cfl.methods import METHODS

    backbone_methods = {name for name in METHODS.names() if METHODS[name].requires.model_train}
    for stream in ("cifar100", "imagenet-r"):
        named = {word.removeprefix("method.name=") for command in documented_commands()
                 if command[2] == f"configs/pretrained-fcil-{stream}.yaml" for word in command
                 if word.startswith("method.name=")}
        assert named == backbone_methods, stream
