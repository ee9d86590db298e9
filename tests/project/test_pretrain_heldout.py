"""benchmarks/pretrain_backbone.py --exclude: the pretraining images leave out every image (training and test)
of a sweep's streams, compared by content, over every seed of the sweep; refused when the streams' training
images are not among the pretraining data (another data root: the comparison would compare nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from cfl.data.mnist_like import FASHION_MNIST, load_idx
from tests import fake_data
from tests.helpers import benchmark_module


def script():
    return benchmark_module("pretrain_backbone")


def sweep(tmp_path: Path, data: Path) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "base": {"stream": {"name": "split-fmnist", "num_tasks": 2, "scenario": "class", "train_per_class": 4,
                            "test_per_class": 2},
                 "model": {"name": "vit-ti16", "weights": str(tmp_path / "not-made-yet.safetensors"),
                           "image_size": 32},
                 "data_root": str(data), "method": {"name": "fedncm"}, "num_clients": 2, "clients_per_round": 2},
        "out": str(tmp_path / "runs"), "grid": {"seed": [0, 1]}}))
    return path


def test_every_image_of_the_sweeps_streams_is_left_out(tmp_path):
    pytest.importorskip("timm")
    fake_data.write_idx_dataset(tmp_path / "data" / "fashion-mnist", n_train=200, n_test=60, gz=False)
    (train_x, train_y), _ = load_idx(FASHION_MNIST, tmp_path / "data")
    kept_x, kept_y, info = script().held_out(train_x, train_y, [sweep(tmp_path, tmp_path / "data")], None)
    from cfl.data.load import load_stream

    used = set()
    for seed in (0, 1):
        stream = load_stream("split-fmnist", num_tasks=2, scenario="class", seed=seed, data_root=str(tmp_path / "data"),
                             download=False, train_per_class=4, test_per_class=2)
        used |= {x.numpy().tobytes() for t in stream.tasks for x in t.train_x}
    kept = {x.numpy().tobytes() for x in kept_x}
    assert used and not used & kept
    assert info["streams"] == 2 and info["stream_train_images"] == len(used)
    assert info["train_images_left_out"] == len(train_x) - len(kept_x) >= len(used)
    assert info["train_images_used"] == len(kept_x) == len(kept_y) > 0
    assert torch.isin(kept_y, torch.arange(10)).all()


def test_streams_of_other_data_are_refused(tmp_path):
    pytest.importorskip("timm")
    fake_data.write_idx_dataset(tmp_path / "data" / "fashion-mnist", n_train=200, n_test=60, gz=False)
    (train_x, train_y), _ = load_idx(FASHION_MNIST, tmp_path / "data")
    with pytest.raises(SystemExit, match="not among Fashion-MNIST's training images"):  # other values: other data
        script().held_out(train_x + 0.5, train_y, [sweep(tmp_path, tmp_path / "data")], None)


def test_the_joint_probe_reads_each_seeds_stream_and_separates_separable_data(tmp_path):
    pytest.importorskip("timm")
    pytest.importorskip("sklearn")
    fake_data.write_idx_dataset(tmp_path / "data" / "fashion-mnist", n_train=200, n_test=60, gz=False)
    path = sweep(tmp_path, tmp_path / "data")
    configs = benchmark_module("probe_backbone").head_configs(path, "random")
    assert [c.seed for c in configs] == [0, 1] and all(c.model.weights == "random" for c in configs)
    row = benchmark_module("probe_backbone").probe(configs[0], 1.0)
    assert row["classes"] == 4 and row["train"] == 16 and row["test"] == 8  # 2 tasks x 2 classes, 4 / 2 a class
    assert row["probe_accuracy"] >= 75.0  # the fake images' brightness encodes the label
    with pytest.raises(SystemExit, match="no run of the sweep trains a head"):
        data = yaml.safe_load(path.read_text())
        data["base"]["model"]["train"] = "all"
        data["base"]["method"] = {"name": "fedavg"}
        path.write_text(yaml.safe_dump(data))
        benchmark_module("probe_backbone").head_configs(path, "random")


def test_the_task_incremental_companion_holds_the_class_tables_images(tmp_path):
    """The in-house backbone left out the class-incremental table's images; its task-incremental companion
    (Powder's) must evaluate on those same images: the two sweeps' streams differ in the scenario alone, and a
    stream's seeded per-class subset does not depend on the scenario."""
    from cfl.app.sweep import load_sweep
    from cfl.data.load import load_stream

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "pretrained"
    streams = {}
    for name in ("inhouse-fmnist-32", "inhouse-fmnist-32-task"):
        runs = load_sweep(root / f"{name}.yaml", out=tmp_path / name, read_weights=False)
        streams[name] = {(r.config.seed, tuple(sorted({**r.config.stream_fields(), "scenario": "-"}.items())))
                         for r in runs}
    assert streams["inhouse-fmnist-32-task"] <= streams["inhouse-fmnist-32"]
    fake_data.write_idx_dataset(tmp_path / "data" / "fashion-mnist", n_train=200, n_test=60, gz=False)
    images = {}
    for scenario in ("class", "task"):
        stream = load_stream("split-fmnist", num_tasks=2, scenario=scenario, seed=1, data_root=str(tmp_path / "data"),
                             download=False, train_per_class=4, test_per_class=2)
        images[scenario] = [x.numpy().tobytes() for t in stream.tasks for x in (*t.train_x, *t.test_x)]
    assert images["class"] == images["task"] and images["task"]
