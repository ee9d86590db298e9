"""Builders of the FOT reference streams (FOT paper and code): Permuted MNIST, Split CIFAR-100, 5-Datasets,
Mini-ImageNet. Each dataset is decoded once into uint8 tensors (cached, see :mod:`cfl.data.cache`),
normalised here, then cut into tasks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from cfl.data.augment import CropFlip
from cfl.data.cache import cached_tensors
from cfl.data.cifar import (
    CIFAR10_LAYOUT,
    CIFAR100_ARCHIVE,
    CIFAR100_LAYOUT,
    cifar10_files,
    cifar100_files,
    how_to_get,
    read_cifar10,
    read_cifar100,
)
from cfl.data.derive import avalanche_permutations, permuted_tasks, split_tasks
from cfl.data.files import require_classes
from cfl.data.mini_imagenet import (
    MINI_LAYOUT,
    mini_imagenet_sources,
    read_mini_imagenet_folder,
    read_mini_imagenet_pickles,
)
from cfl.data.mini_imagenet import how_to_get as mini_imagenet_how
from cfl.data.mnist_like import FASHION_MNIST, MNIST, load_idx, load_idx_raw
from cfl.data.notmnist import NOTMNIST_LAYOUT, notmnist_files, read_notmnist
from cfl.data.request import StreamRequest
from cfl.data.stream import Stream, Task
from cfl.data.svhn import SVHN_LAYOUT, read_svhn, svhn_files

Split = tuple[torch.Tensor, torch.Tensor]


def channel_normalise(raw: dict[str, torch.Tensor]) -> tuple[Split, Split, torch.Tensor]:
    """uint8 ``(N, C, H, W)`` -> float normalised per channel with the training set's mean and std.

    Also returns the normalised value of a black pixel per channel (the padding of :class:`CropFlip`).
    """
    train = raw["train_x"]
    mean = torch.stack([train[:, c].float().mean() for c in range(train.shape[1])]) / 255.0
    std = torch.stack([train[:, c].float().std() for c in range(train.shape[1])]) / 255.0
    shift, scale = (mean * 255.0).view(1, -1, 1, 1), (std * 255.0).view(1, -1, 1, 1)

    def norm(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32).sub_(shift).div_(scale)

    return (norm(train), raw["train_y"]), (norm(raw["test_x"]), raw["test_y"]), -mean / std


def permuted_mnist(req: StreamRequest) -> Stream:
    """Avalanche's PermutedMNIST on tensors: Normalize(0.1307, 0.3081), then per experience the pixel
    permutation ``np.random.RandomState(seed).permutation(784)`` (Avalanche's draw), flattened to 784."""
    train, test = load_idx(MNIST, req.data_root, req.download)
    tasks = permuted_tasks(train, test, req.num_tasks, req.seed, "perm-mnist",
                           permutations=avalanche_permutations(req.seed, req.num_tasks, 784))
    return Stream("permuted-mnist", "domain", tasks, 10, (784,), "mlp")


def split_cifar100(req: StreamRequest) -> Stream:
    """Avalanche's SplitCIFAR100 with a fixed label-order class split: 10 tasks of 10 classes."""
    files = cifar100_files(req.data_root, req.download)
    raw = cached_tensors(req.data_root / "cache", "cifar-100", files, lambda: read_cifar100(files),
                         layout=CIFAR100_LAYOUT)
    require_classes("CIFAR-100", files, raw, 10 * req.num_tasks, how_to_get(files[0].parent, CIFAR100_ARCHIVE))
    train, test, _ = channel_normalise(raw)
    tasks = split_tasks(train, test, 10, req.num_tasks, req.scenario == "class", "split-cifar100")
    classes = 100 if req.scenario == "class" else 10
    return Stream("split-cifar100", req.scenario, tasks, classes, (3, 32, 32), "alexnet")


def _grey_to_rgb32(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """28x28 grey -> zero-padded to 32x32, repeated to 3 channels."""
    out = dict(raw)
    for split in ("train", "test"):
        x = raw[f"{split}_x"]
        out[f"{split}_x"] = F.pad(x, (2, 2, 2, 2)).unsqueeze(1).repeat(1, 3, 1, 1)
    return out


def _five_sources(root: Path, download: bool) -> list[tuple[str, Callable[[], dict[str, torch.Tensor]]]]:
    """(name, loader of uint8 (N, 3, 32, 32) tensors) per dataset, in stream order. Every location is
    checked (and fails clearly) before anything is decoded; decoded datasets are cached."""
    cache = root / "cache"
    c10, svhn = cifar10_files(root, download), svhn_files(root, download)
    load_idx_raw(MNIST, root, download)
    load_idx_raw(FASHION_MNIST, root, download)
    notmnist = notmnist_files(root)
    return [("cifar-10", lambda: cached_tensors(cache, "cifar-10", c10, lambda: read_cifar10(c10),
                                                layout=CIFAR10_LAYOUT)),
            ("mnist", lambda: _grey_to_rgb32(load_idx_raw(MNIST, root, download))),
            ("svhn", lambda: cached_tensors(cache, "svhn", svhn, lambda: read_svhn(svhn), layout=SVHN_LAYOUT)),
            ("fashion-mnist", lambda: _grey_to_rgb32(load_idx_raw(FASHION_MNIST, root, download))),
            ("notmnist", lambda: _grey_to_rgb32(cached_tensors(cache, "notmnist", notmnist,
                                                               lambda: read_notmnist(notmnist),
                                                               layout=NOTMNIST_LAYOUT)))]


def five_datasets(req: StreamRequest) -> Stream:
    """5-Datasets (Ebrahimi et al. 2020): CIFAR-10, MNIST, SVHN, Fashion-MNIST, notMNIST, one task each,
    32x32x3, normalised per dataset; labels 0..9 per task, one head per task."""
    tasks = []
    for t, (name, load) in enumerate(_five_sources(req.data_root, req.download)[: req.num_tasks]):
        (train_x, train_y), (test_x, test_y), _ = channel_normalise(load())
        tasks.append(Task(f"5d-{name}", train_x, train_y, test_x, test_y, list(range(10 * t, 10 * t + 10))))
    return Stream("five-datasets", "task", tasks, 10, (3, 32, 32), "resnet18-reduced")


def mini_imagenet(req: StreamRequest) -> Stream:
    """Mini-ImageNet: 20 tasks of 5 classes in label order, labels 0..4 per task, one head per task;
    train-time random crop (pad 4) and horizontal flip on tensors (:class:`CropFlip`)."""
    kind, files = mini_imagenet_sources(req.data_root)
    read = (lambda: read_mini_imagenet_pickles(files)) if kind == "pickle" else (
        lambda: read_mini_imagenet_folder(files[0]))
    raw = cached_tensors(req.data_root / "cache", f"mini-imagenet-{kind}", files, read, layout=MINI_LAYOUT)
    require_classes("Mini-ImageNet", files, raw, 5 * req.num_tasks, mini_imagenet_how(req.data_root))
    train, test, black = channel_normalise(raw)
    tasks = split_tasks(train, test, 5, req.num_tasks, False, "mini-imagenet")
    return Stream("mini-imagenet", "task", tasks, 5, (3, 84, 84), "resnet18-mini", augment=CropFlip(4, black))
