"""cfl's built-in streams against Avalanche's classic benchmarks, both built OFFLINE from the same small files
in the standard formats (written where cfl and torchvision look for them under one data root).

Each test converts the Avalanche benchmark with ``from_avalanche`` (eval transforms) and checks that both
hold the same (image, label, task) triples, up to the differences docs/streams.md states: Avalanche groups
each experience's samples by class (cfl keeps file order; both keep file order within a class),
PermutedMNIST images are 1x28x28 (cfl flattens them to 784), SplitFMNIST/SplitCIFAR100 draw a random class
order unless given ``fixed_class_order`` (cfl: label order), and SplitCIFAR100 normalises with fixed
CIFAR-100 statistics and augments its training images (cfl: the training set's own per-channel statistics,
no augmentation).

torchvision's CIFAR-100 reader checks the MD5 sums of the official files, which generated files cannot
match; the ``no_md5`` fixture replaces ``torchvision.datasets.cifar.check_integrity`` for these tests only by a
check that the file exists (the files are still read by torchvision's own code). MNIST and Fashion-MNIST
need no patch: torchvision checks only that their un-gzipped IDX files exist under ``<root>/<Name>/raw``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from cfl.data.stream import Stream
from cfl.data.stream_registry import STREAMS, StreamRequest
from cfl.streams import from_avalanche
from tests.fake_data import write_cifar100, write_idx_dataset

pytestmark = pytest.mark.avalanche  # imports avalanche-lib (seconds, once per process)

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)  # Avalanche's SplitCIFAR100


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """MNIST and Fashion-MNIST (20 train / 10 test images per class, un-gzipped IDX in torchvision's
    ``<Name>/raw`` folders, which cfl reads too) and CIFAR-100 (6 train / 2 test images per class)."""
    root = tmp_path_factory.mktemp("avalanche-data")
    for name in ("MNIST", "FashionMNIST"):
        write_idx_dataset(root / name / "raw", n_train=200, n_test=100, gz=False)
    write_cifar100(root, per_class_train=6, per_class_test=2, str_keys=True)
    return root


@pytest.fixture
def no_md5(monkeypatch):
    import torchvision.datasets.cifar

    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity",
                        lambda fpath, md5=None: os.path.isfile(fpath))  # noqa: ARG005 - its signature


def cfl_stream(name: str, root: Path, num_tasks: int, scenario: str, seed: int = 0) -> Stream:
    return STREAMS[name].build(StreamRequest(num_tasks, scenario, seed, root, False))


def assert_same_tasks(avalanche: Stream, cfl: Stream, view=lambda x: x, atol: float = 1e-5) -> None:
    """Same scenario, head, tasks, classes; per task, split and class the same images in the same (file)
    order, once Avalanche's are mapped by ``view``."""
    assert (avalanche.scenario, avalanche.classes_per_head, avalanche.num_tasks) == \
        (cfl.scenario, cfl.classes_per_head, cfl.num_tasks)
    for a, c in zip(avalanche.tasks, cfl.tasks, strict=True):
        assert a.classes == c.classes
        for split in ("train", "test"):
            (xa, ya), (xc, yc) = ((getattr(t, f"{split}_x"), getattr(t, f"{split}_y")) for t in (a, c))
            assert torch.equal(ya.sort().values, yc.sort().values)
            for label in yc.unique():
                assert torch.allclose(view(xa[ya == label]), xc[yc == label], atol=atol)


def test_permuted_mnist_is_avalanches_PermutedMNIST_flattened(root):
    from avalanche.benchmarks.classic import PermutedMNIST

    avalanche = from_avalanche(PermutedMNIST(3, seed=7, dataset_root=str(root)))
    cfl = cfl_stream("permuted-mnist", root, 3, "domain", seed=7)
    assert (avalanche.input_shape, cfl.input_shape) == ((1, 28, 28), (784,))
    assert_same_tasks(avalanche, cfl, view=lambda x: x.flatten(1))
    assert not torch.equal(cfl.tasks[0].train_x, cfl.tasks[1].train_x)  # one permutation per task


@pytest.mark.parametrize("scenario", ["task", "class"])
def test_split_fmnist_is_avalanches_SplitFMNIST_in_label_order(root, scenario):
    from avalanche.benchmarks.classic import SplitFMNIST

    benchmark = SplitFMNIST(5, return_task_id=scenario == "task", fixed_class_order=list(range(10)),
                            dataset_root=str(root))
    assert_same_tasks(from_avalanche(benchmark), cfl_stream("split-fmnist", root, 5, scenario))


def test_split_fmnist_without_a_fixed_class_order_is_avalanches_seeded_shuffle(root):
    from avalanche.benchmarks.classic import SplitFMNIST

    assert SplitFMNIST(5, seed=0, dataset_root=str(root)).classes_order != list(range(10))


@pytest.mark.usefixtures("no_md5")
@pytest.mark.parametrize("scenario", ["task", "class"])
def test_split_cifar100_is_avalanches_SplitCIFAR100_up_to_its_normalisation(root, scenario):
    from avalanche.benchmarks.classic import SplitCIFAR100

    benchmark = SplitCIFAR100(10, fixed_class_order=list(range(100)), return_task_id=scenario == "task",
                              dataset_root=str(root))
    avalanche, cfl = from_avalanche(benchmark), cfl_stream("split-cifar100", root, 10, scenario)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (CIFAR100_MEAN, CIFAR100_STD))

    def pixels(x: torch.Tensor) -> torch.Tensor:  # Avalanche's ToTensor + Normalize, undone: 0..255
        return (x * std + mean) * 255

    train = torch.cat([pixels(t.train_x) for t in avalanche.tasks])
    assert torch.allclose(train, train.round(), atol=1e-3)  # whole pixel values: Avalanche's constants
    dims = (0, 2, 3)
    own_mean, own_std = train.round().mean(dims, keepdim=True), train.round().std(dims, keepdim=True)
    assert_same_tasks(avalanche, cfl, view=lambda x: (pixels(x).round() - own_mean) / own_std, atol=1e-4)


def test_split_cifar100_trains_without_avalanches_augmentation(root):
    from avalanche.benchmarks.classic.ccifar100 import _default_cifar100_train_transform

    steps = [type(t).__name__ for t in _default_cifar100_train_transform.transforms]
    assert steps[:2] == ["RandomCrop", "RandomHorizontalFlip"]
    assert cfl_stream("split-cifar100", root, 1, "task").augment is None
