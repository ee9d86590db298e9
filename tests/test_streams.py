"""Streams built from real Fashion-MNIST (skipped where absent) and from generated files in every format:
tasks, shapes, classes per task, label ranges, permutation determinism, normalisation, and `cfl run`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cfl.config import from_dict
from cfl.data.augment import CropFlip
from cfl.data.load import load_stream
from cfl.engine.runner import Runner
from cfl.run import execute
from cfl.schema import ConfigError
from tests import fake_data

FMNIST = Path("/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(not (FMNIST / "train-images-idx3-ubyte.gz").is_file(),
                                  reason=f"real Fashion-MNIST not installed in {FMNIST} "
                                         "(apt-get install dataset-fashion-mnist)")


def cfg(root: Path, name: str, num_tasks: int, **extra):
    data = {"stream": {"name": name, "num_tasks": num_tasks, **extra.pop("stream", {})}, "data_root": str(root),
            "num_clients": 4, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 4, "lr": 0.01,
            "threads": 1, "wandb": {"mode": "disabled"}, **extra}
    return from_dict(data)


@pytest.fixture(scope="module")
def fmnist_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fmnist")  # empty: the system copy is found, the cache goes here


@needs_fmnist
def test_permuted_fmnist_real(fmnist_root):
    stream = load_stream(cfg(fmnist_root, "permuted-fmnist", 2))
    assert stream.scenario == "domain" and stream.input_shape == (784,) and stream.default_model == "mlp"
    t0, t1 = stream.tasks
    assert t0.train_x.shape == (60000, 784) and t0.test_x.shape == (10000, 784)
    assert t0.classes == list(range(10)) and torch.equal(t0.train_y, t1.train_y)
    # one fixed permutation per task: same pixel multiset, different order
    assert torch.equal(t0.train_x[0].sort().values, t1.train_x[0].sort().values)
    assert not torch.equal(t0.train_x[0], t1.train_x[0])
    assert abs(t0.train_x.mean().item()) < 0.01 and abs(t0.train_x.std().item() - 1) < 0.01


@needs_fmnist
def test_split_fmnist_real(fmnist_root):
    stream = load_stream(cfg(fmnist_root, "split-fmnist", 5))
    assert stream.scenario == "task" and stream.classes_per_head == 2 and stream.num_tasks == 5
    for t, task in enumerate(stream.tasks):
        assert task.classes == [2 * t, 2 * t + 1]
        assert task.train_x.shape == (12000, 1, 28, 28) and task.test_x.shape == (2000, 1, 28, 28)
        assert sorted(set(task.train_y.tolist())) == [0, 1]
    class_il = load_stream(cfg(fmnist_root, "split-fmnist", 2, stream={"scenario": "class"}))
    assert class_il.classes_per_head == 10 and sorted(set(class_il.tasks[1].train_y.tolist())) == [2, 3]


def test_permuted_mnist_uses_avalanches_permutations(tmp_path):
    arrays = fake_data.write_idx_dataset(tmp_path / "mnist", gz=False)
    stream = load_stream(cfg(tmp_path, "permuted-mnist", 3, seed=4))
    rng = np.random.RandomState(4)  # Avalanche's PermutedMNIST draw, one permutation per experience
    base = (torch.from_numpy(arrays["t10k_x"]).float().view(20, 784) / 255 - 0.1307) / 0.3081
    for task in stream.tasks:
        perm = torch.from_numpy(rng.permutation(784))
        torch.testing.assert_close(task.test_x, base[:, perm])
    assert stream.tasks[0].test_y.tolist() == arrays["t10k_y"].tolist()
    other = load_stream(cfg(tmp_path, "permuted-mnist", 1, stream={"seed": 5}, seed=4))  # stream.seed wins
    perm5 = torch.from_numpy(np.random.RandomState(5).permutation(784))
    torch.testing.assert_close(other.tasks[0].test_x, base[:, perm5])


def test_split_cifar100_tasks(tmp_path):
    fake_data.write_cifar100(tmp_path)
    stream = load_stream(cfg(tmp_path, "split-cifar100", 10))
    assert stream.scenario == "task" and stream.input_shape == (3, 32, 32) and stream.default_model == "alexnet"
    for t, task in enumerate(stream.tasks):
        assert task.classes == list(range(10 * t, 10 * t + 10))
        assert task.train_x.shape == (20, 3, 32, 32) and task.test_x.shape == (10, 3, 32, 32)
        assert sorted(task.train_y.tolist()) == sorted(list(range(10)) * 2)
    all_train = torch.cat([t.train_x for t in stream.tasks])
    assert torch.allclose(all_train.mean((0, 2, 3)), torch.zeros(3), atol=1e-4)


def write_five(root: Path) -> None:
    fake_data.write_cifar10(root)
    fake_data.write_idx_dataset(root / "mnist", n_train=30, n_test=10)
    fake_data.write_svhn(root)
    fake_data.write_idx_dataset(root / "fashion-mnist", n_train=40, n_test=10, gz=False)
    fake_data.write_notmnist(root)


def test_five_datasets_tasks(tmp_path):
    write_five(tmp_path)
    stream = load_stream(cfg(tmp_path, "five-datasets", 5))
    assert [t.name for t in stream.tasks] == ["5d-cifar-10", "5d-mnist", "5d-svhn", "5d-fashion-mnist", "5d-notmnist"]
    assert [len(t.train_x) for t in stream.tasks] == [100, 30, 30, 40, 40]
    for t, task in enumerate(stream.tasks):
        assert task.train_x.shape[1:] == (3, 32, 32) and task.classes == list(range(10 * t, 10 * t + 10))
        assert set(task.train_y.tolist()) <= set(range(10))
        # per-dataset normalisation: each task's training set has channel mean 0 and std 1
        torch.testing.assert_close(task.train_x.mean((0, 2, 3)), torch.zeros(3), atol=1e-4, rtol=0)
        torch.testing.assert_close(task.train_x.std((0, 2, 3)), torch.ones(3), atol=1e-2, rtol=0)
    mnist = stream.tasks[1].train_x
    assert torch.equal(mnist[:, 0], mnist[:, 2])  # grey repeated to 3 channels
    assert torch.equal(mnist[:, :, :2], mnist[:, :, :2].amin().expand_as(mnist[:, :, :2]))  # zero-padding rows


def test_mini_imagenet_tasks_and_augmentation(tmp_path):
    fake_data.write_mini_imagenet(tmp_path, classes=10, per_class=6)
    stream = load_stream(cfg(tmp_path, "mini-imagenet", 2))
    assert stream.scenario == "task" and stream.classes_per_head == 5 and stream.default_model == "resnet18-mini"
    assert isinstance(stream.augment, CropFlip)
    for t, task in enumerate(stream.tasks):
        assert task.classes == list(range(5 * t, 5 * t + 5))
        assert task.train_x.shape == (25, 3, 84, 84) and task.test_x.shape == (5, 3, 84, 84)
        assert sorted(task.test_y.tolist()) == list(range(5))


WRITERS = {"permuted-mnist": lambda r: fake_data.write_idx_dataset(r / "mnist"),
           "split-cifar100": fake_data.write_cifar100, "five-datasets": write_five,
           "mini-imagenet": lambda r: fake_data.write_mini_imagenet(r, 10, 6)}


@pytest.mark.parametrize("name", ["split-cifar100", "five-datasets", "mini-imagenet"])
def test_reference_model_trains_on_generated_stream(tmp_path, name):
    """One round per task with the stream's reference model (alexnet, resnet18-reduced, resnet18-mini)."""
    WRITERS[name](tmp_path)
    config = cfg(tmp_path, name, 2)
    runner = Runner(config, load_stream(config))
    runner.run()
    matrix = runner.progress.acc_matrix
    assert all(0 <= matrix[1][j] <= 100 for j in range(2))


def test_cfl_run_end_to_end_on_generated_files(tmp_path):
    WRITERS["permuted-mnist"](tmp_path)
    results = execute(cfg(tmp_path, "permuted-mnist", 2), out=tmp_path / "run", quiet=True)
    assert len(results["acc_matrix"]) == 2 and (tmp_path / "run" / "results.json").is_file()


def test_augmentation_runs_in_the_sequential_trainer_too(tmp_path):
    WRITERS["mini-imagenet"](tmp_path)
    config = cfg(tmp_path, "mini-imagenet", 1, client_execution="sequential")
    runner = Runner(config, load_stream(config))
    runner.run()
    assert len(runner.progress.acc_matrix) == 1


@pytest.mark.parametrize("name,dataset", [("split-cifar100", "CIFAR-100"), ("permuted-mnist", "MNIST"),
                                          ("five-datasets", "CIFAR-10"), ("mini-imagenet", "Mini-ImageNet")])
def test_missing_files_fail_before_training(tmp_path, name, dataset):
    with pytest.raises(ConfigError) as err:
        execute(cfg(tmp_path, name, 1), out=tmp_path / "run", quiet=True)
    text = str(err.value)
    assert text.startswith(dataset) and str(tmp_path) in text and "To get them" in text
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
