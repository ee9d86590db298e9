"""Streams built from real Fashion-MNIST (skipped where absent), from generated files in every format and
from the offline digits: exact task contents (permutations, classes, labels), augmentation (a known image
under a fixed generator; applied to training inputs only), and the outputs of a run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.func import functional_call

from cfl.app.single_run import execute
from cfl.config.schema import ConfigError
from cfl.data.augment import CropFlip
from cfl.data.digits import load_digits_tensors
from cfl.data.load import load_stream
from cfl.engine.rounds.runner import Runner
from cfl.validation import from_dict
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


def built(root: Path, name: str, num_tasks: int, **extra):
    """The stream of the config :func:`cfg` makes, loaded."""
    return load_stream(**cfg(root, name, num_tasks, **extra).stream_fields())


@pytest.fixture(scope="module")
def fmnist_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fmnist")  # empty: the system copy is found, the cache goes here


@needs_fmnist
def test_permuted_fmnist_real(fmnist_root):
    stream = built(fmnist_root, "permuted-fmnist", 2)
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
    stream = built(fmnist_root, "split-fmnist", 5)
    assert stream.scenario == "task" and stream.classes_per_head == 2 and stream.num_tasks == 5
    for t, task in enumerate(stream.tasks):
        assert task.classes == [2 * t, 2 * t + 1]
        assert task.train_x.shape == (12000, 1, 28, 28) and task.test_x.shape == (2000, 1, 28, 28)
        assert sorted(set(task.train_y.tolist())) == [0, 1]
    class_il = built(fmnist_root, "split-fmnist", 2, stream={"scenario": "class"})
    assert class_il.classes_per_head == 10 and sorted(set(class_il.tasks[1].train_y.tolist())) == [2, 3]


def test_permuted_mnist_uses_avalanches_permutations(tmp_path):
    arrays = fake_data.write_idx_dataset(tmp_path / "mnist", gz=False)
    stream = built(tmp_path, "permuted-mnist", 3, seed=4)
    rng = np.random.RandomState(4)  # Avalanche's PermutedMNIST draw, one permutation per experience
    base = (torch.from_numpy(arrays["t10k_x"]).float().view(20, 784) / 255 - 0.1307) / 0.3081
    for task in stream.tasks:
        perm = torch.from_numpy(rng.permutation(784))
        torch.testing.assert_close(task.test_x, base[:, perm])
    assert stream.tasks[0].test_y.tolist() == arrays["t10k_y"].tolist()
    other = built(tmp_path, "permuted-mnist", 1, stream={"seed": 5}, seed=4)  # stream.seed wins
    perm5 = torch.from_numpy(np.random.RandomState(5).permutation(784))
    torch.testing.assert_close(other.tasks[0].test_x, base[:, perm5])


def test_split_cifar100_tasks(tmp_path):
    fake_data.write_cifar100(tmp_path)
    stream = built(tmp_path, "split-cifar100", 10)
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
    with pytest.warns(UserWarning, match="notMNIST: skipped 10 unreadable PNG files"):  # the empty ones
        stream = built(tmp_path, "five-datasets", 5)
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
    stream = built(tmp_path, "mini-imagenet", 2)
    assert stream.scenario == "task" and stream.classes_per_head == 5 and stream.default_model == "resnet18-mini"
    assert isinstance(stream.augment, CropFlip)
    for t, task in enumerate(stream.tasks):
        assert task.classes == list(range(5 * t, 5 * t + 5))
        assert task.train_x.shape == (25, 3, 84, 84) and task.test_x.shape == (5, 3, 84, 84)
        assert sorted(task.test_y.tolist()) == list(range(5))


WRITERS = {"permuted-mnist": lambda r: fake_data.write_idx_dataset(r / "mnist"),
           "split-cifar100": fake_data.write_cifar100, "five-datasets": write_five,
           "mini-imagenet": lambda r: fake_data.write_mini_imagenet(r, 10, 6)}


def recomputed_accuracy(runner: Runner, j: int) -> float:
    """Task j's test accuracy of the runner's global model, computed here from the logits."""
    task = runner.stream.tasks[j]
    runner.model.eval()
    with torch.no_grad():
        logits = functional_call(runner.model, runner.params, (task.test_x, torch.full_like(task.test_y, j)))
    return 100.0 * (logits.argmax(1) == task.test_y).sum().item() / len(task.test_y)


def assert_final_row_is_the_final_model(runner: Runner) -> None:
    """The accuracy matrix is lower triangular and its last row is the final model's accuracy on each task."""
    matrix, n = runner.progress.acc_matrix, runner.stream.num_tasks
    assert all(matrix[i][j] is None for i in range(n) for j in range(i + 1, n)), matrix
    assert all(isinstance(matrix[i][j], float) for i in range(n) for j in range(i + 1)), matrix
    assert matrix[n - 1] == pytest.approx([recomputed_accuracy(runner, j) for j in range(n)], abs=1e-9)


@pytest.mark.parametrize("name", ["split-cifar100", "five-datasets", "mini-imagenet"])
def test_reference_model_trains_on_generated_stream(tmp_path, name):
    """One round per task with the stream's reference model (alexnet, resnet18-reduced, resnet18-mini)."""
    WRITERS[name](tmp_path)
    config = cfg(tmp_path, name, 2)
    runner = Runner(config, load_stream(**config.stream_fields()))
    initial = {k: v.clone() for k, v in runner.params.items()}
    runner.run()
    assert_final_row_is_the_final_model(runner)
    assert runner.progress.global_round == 2
    assert any(not torch.equal(initial[k], runner.params[k]) for k in initial)  # it trained


def test_cfl_run_end_to_end_on_generated_files(tmp_path):
    WRITERS["permuted-mnist"](tmp_path)
    results = execute(cfg(tmp_path, "permuted-mnist", 2, rounds_per_task=2), out=tmp_path / "run", quiet=True)
    matrix = results["acc_matrix"]
    assert matrix[0][1] is None and all(isinstance(matrix[i][j], float) for i, j in ((0, 0), (1, 0), (1, 1)))
    assert all((matrix[i][j] / 5).is_integer() for i, j in ((0, 0), (1, 0), (1, 1)))  # 20 test images each
    assert results["rounds"] == 4 and results["acc"] == pytest.approx((matrix[1][0] + matrix[1][1]) / 2)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["round", "round", "evaluation"] * 2  # evaluated at each task end


@pytest.mark.parametrize("name,dataset", [("split-cifar100", "CIFAR-100"), ("permuted-mnist", "MNIST"),
                                          ("five-datasets", "CIFAR-10"), ("mini-imagenet", "Mini-ImageNet")])
def test_missing_files_fail_before_training(tmp_path, name, dataset):
    with pytest.raises(ConfigError) as err:
        execute(cfg(tmp_path, name, 1), out=tmp_path / "run", quiet=True)
    text = str(err.value)
    assert text.startswith(dataset) and str(tmp_path) in text and "To get them" in text
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()


# ---- exact contents of the offline streams ----
def test_permuted_stream_tasks_are_permutations_of_the_same_images(tmp_path):
    (train_x, train_y), (test_x, test_y) = load_digits_tensors()
    stream = built(tmp_path, "permuted-digits", 3, seed=7)
    gen = torch.Generator().manual_seed(7)  # the documented draw: successive randperm(64) of a seeded generator
    perms = [torch.randperm(64, generator=gen) for _ in range(3)]
    assert len({tuple(p.tolist()) for p in perms}) == 3
    t0 = stream.tasks[0]
    for t, (task, perm) in enumerate(zip(stream.tasks, perms, strict=True)):
        assert torch.equal(task.train_x, train_x.flatten(1)[:, perm])
        assert torch.equal(task.test_x, test_x.flatten(1)[:, perm])
        # task t is task 0's images with task 0's permutation undone and task t's applied
        assert torch.equal(task.train_x, t0.train_x[:, torch.argsort(perms[0])][:, perm])
        assert torch.equal(task.train_y, train_y) and torch.equal(task.test_y, test_y)
        assert task.classes == list(range(10)) and task.name == f"perm-digits-{t}"
    assert stream.classes_per_head == 10 and stream.class_mask(2) is None


@pytest.mark.parametrize("scenario", ["task", "class"])
def test_split_stream_tasks_hold_exactly_their_classes(tmp_path, scenario):
    (train_x, train_y), (test_x, test_y) = load_digits_tensors()
    stream = built(tmp_path, "split-digits", 5, stream={"scenario": scenario})
    assert stream.classes_per_head == (10 if scenario == "class" else 2)
    for t, task in enumerate(stream.tasks):
        assert task.classes == [2 * t, 2 * t + 1]
        for x, y, all_x, all_y in ((task.train_x, task.train_y, train_x, train_y),
                                   (task.test_x, task.test_y, test_x, test_y)):
            mine = (all_y == 2 * t) | (all_y == 2 * t + 1)  # every sample of the two classes, in file order
            assert torch.equal(x, all_x[mine])
            expected = all_y[mine] if scenario == "class" else all_y[mine] - 2 * t
            assert torch.equal(y, expected)
    total = sum(len(task.train_y) for task in stream.tasks)
    assert total == len(train_y)  # no sample dropped, none in two tasks
    if scenario == "class":
        assert stream.class_mask(1).tolist() == [True] * 4 + [False] * 6


# ---- augmentation: what it does, and that it reaches training but not evaluation ----
def test_crop_flip_on_a_known_image():
    """Pad 1 with black (-1), then per image a crop offset (dy, dx) in 0..2 and a flip with probability 1/2.

    Padded image 0:  -1 -1 -1 -1     seed 0 draws dy = (2, 0), dx = (2, 0), flip = (yes, no):
                     -1  1  2 -1     image 0: rows 2..3, cols 2..3 = [[4, -1], [-1, -1]], mirrored;
                     -1  3  4 -1     image 1: rows 0..1, cols 0..1 = [[-1, -1], [-1, 5]].
                     -1 -1 -1 -1     seed 5 draws dy = (2, 0), dx = (1, 0), flip = (no, yes).
    """
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[5.0, 6.0], [7.0, 8.0]]]])
    augment = CropFlip(1, torch.tensor([-1.0]))
    out = augment(x, torch.Generator().manual_seed(0))
    assert out.tolist() == [[[[-1.0, 4.0], [-1.0, -1.0]]], [[[-1.0, -1.0], [-1.0, 5.0]]]]
    out = augment(x, torch.Generator().manual_seed(5))
    assert out.tolist() == [[[[3.0, 4.0], [-1.0, -1.0]]], [[[-1.0, -1.0], [5.0, -1.0]]]]
    assert torch.equal(x, torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[5.0, 6.0], [7.0, 8.0]]]]))  # input kept


def test_crop_flip_draws_every_offset_and_flips_half():
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).repeat(3600, 1, 1, 1)
    out = CropFlip(1, torch.tensor([-1.0]))(x, torch.Generator().manual_seed(1))
    kinds, counts = torch.unique(out.flatten(1), dim=0, return_counts=True)
    assert len(kinds) == 18  # 9 crops x (plain, mirrored): all distinct for this image
    assert counts.min() > 3600 / 18 * 0.7 and counts.max() < 3600 / 18 * 1.3


class RecordingAugment:
    """The stream's CropFlip, recording every batch it gets and gives."""

    def __init__(self, inner: CropFlip) -> None:
        self.inner, self.seen, self.given = inner, [], []

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        out = self.inner(x, generator)
        self.seen.append(x.clone())
        self.given.append(out.clone())
        return out


@pytest.mark.parametrize("execution", ["batched", "sequential"])
def test_augmentation_changes_training_inputs_and_never_evaluation_inputs(tmp_path, monkeypatch, execution):
    import cfl.engine.rounds.evaluation as runner_module  # the one evaluation of the round loop

    config = cfg(tmp_path, "split-digits", 2, client_execution=execution, rounds_per_task=2)
    plain = Runner(config, load_stream(**config.stream_fields()))
    plain.run()
    stream = load_stream(**config.stream_fields())
    stream.augment = augment = RecordingAugment(CropFlip(2, torch.tensor([-9.0])))
    evaluated = []
    real_accuracy = runner_module.accuracy
    monkeypatch.setattr(runner_module, "accuracy",
                        lambda model, params, x, y, *a: evaluated.append(x) or real_accuracy(model, params, x, y, *a))
    runner = Runner(config, stream)
    runner.run()
    train_rows = torch.cat([t.train_x for t in stream.tasks]).flatten(1)
    seen = torch.cat(augment.seen).flatten(1)
    # one local epoch per round: every sampled client's whole share, in 2 tasks x 2 rounds x 2 clients
    assert [len(t.train_y) for t in stream.tasks] == [288, 288] and len(seen) == 2 * 2 * 2 * 72
    assert ((seen[:, None] == train_rows[None]).all(-1).any(1)).all()  # only training images are augmented
    given = torch.cat(augment.given).flatten(1)
    assert (given == -9.0).any(1).float().mean() > 0.5  # most crops show the black padding
    assert any(not torch.equal(runner.params[k], plain.params[k]) for k in plain.params)  # trained on them
    tests = [t.test_x for t in stream.tasks]
    # 3 evaluations (task 0; tasks 0 and 1) and 3 for forward transfer (the initial model on both tasks; task 1
    # before training it)
    assert len(evaluated) == 6 and all(any(torch.equal(x, t) for t in tests) for x in evaluated)
    assert not (torch.cat([x.flatten(1) for x in evaluated]) == -9.0).any()
