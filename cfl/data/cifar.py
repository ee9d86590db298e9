"""CIFAR-10 and CIFAR-100 from their standard "python version" pickles (Krizhevsky 2009).

CIFAR-10: ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch`` (keys ``data``, ``labels``).
CIFAR-100: ``cifar-100-python/train`` and ``test`` (keys ``data``, ``fine_labels``).
``data`` is ``(N, 3072)`` uint8, channel-major rows of a 32x32 image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cfl.data.cache import Layout
from cfl.data.checks import check_images, check_labels, load_pickle
from cfl.data.files import locate, reading

CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
CIFAR100_FILES = ("train", "test")
CIFAR10_ARCHIVE, CIFAR100_ARCHIVE = "cifar-10-python.tar.gz", "cifar-100-python.tar.gz"
CIFAR10_LAYOUT, CIFAR100_LAYOUT = Layout((3, 32, 32), 10), Layout((3, 32, 32), 100)
Split = tuple[torch.Tensor, torch.Tensor]


def read_cifar_batch(path: Path, label_key: str, num_classes: int) -> Split:
    """One pickle -> uint8 images ``(N, 3, 32, 32)`` and int64 labels in ``0..num_classes-1``."""
    batch = load_pickle(path, ("data", label_key), encoding="bytes")
    data = np.asarray(batch["data"])
    check_images(path, data, (3072,))
    if data.dtype != np.uint8:
        raise ValueError(f"{path}: data of type {data.dtype}, expected uint8 pixels")
    labels = np.asarray(batch[label_key])
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: {label_key} of type {labels.dtype}, expected integers")
    check_labels(path, labels, len(data), 0, num_classes - 1)
    return torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()), torch.from_numpy(labels.astype(np.int64))


def how_to_get(folder: Path, archive: str) -> str:
    return (f"set `stream.download: true` (needs network), or unpack {archive} (the CIFAR 'python version' "
            f"from https://www.cs.toronto.edu/~kriz/cifar.html) so that {folder} exists")


def _folder(name: str, root: Path, sub: str, files: tuple[str, ...], archive: str, download: bool,
            tv_class: str) -> Path:
    candidates = [root / sub, root / name.lower() / sub]

    def fetch() -> None:
        import torchvision

        for train in (True, False):
            getattr(torchvision.datasets, tv_class)(str(root), train=train, download=True)

    return locate(name, candidates, files, how_to_get(candidates[0], archive), fetch if download else None)


def _read(name: str, files: list[Path], label_key: str, num_classes: int, archive: str) -> Split:
    parts = []
    for f in files:
        with reading(name, [f], how_to_get(f.parent, archive)):
            parts.append(read_cifar_batch(f, label_key, num_classes))
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def cifar10_files(root: Path, download: bool = False) -> list[Path]:
    """The six CIFAR-10 pickles (five train batches, then the test batch); fails clearly when absent."""
    folder = _folder("CIFAR-10", root, "cifar-10-batches-py", CIFAR10_FILES, CIFAR10_ARCHIVE, download, "CIFAR10")
    return [folder / f for f in CIFAR10_FILES]


def cifar100_files(root: Path, download: bool = False) -> list[Path]:
    """The CIFAR-100 ``train`` and ``test`` pickles; fails clearly when absent."""
    folder = _folder("CIFAR-100", root, "cifar-100-python", CIFAR100_FILES, CIFAR100_ARCHIVE, download, "CIFAR100")
    return [folder / f for f in CIFAR100_FILES]


def read_cifar10(files: list[Path]) -> dict[str, torch.Tensor]:
    """uint8 ``train_x``/``test_x`` ``(N, 3, 32, 32)`` and labels from :func:`cifar10_files`' list."""
    return _splits("CIFAR-10", files[:5], files[5:], "labels", 10, CIFAR10_ARCHIVE)


def read_cifar100(files: list[Path]) -> dict[str, torch.Tensor]:
    """uint8 ``train_x``/``test_x`` ``(N, 3, 32, 32)`` and fine labels from :func:`cifar100_files`' list."""
    return _splits("CIFAR-100", files[:1], files[1:], "fine_labels", 100, CIFAR100_ARCHIVE)


def _splits(name: str, train_files: list[Path], test_files: list[Path], label_key: str, num_classes: int,
            archive: str) -> dict[str, torch.Tensor]:
    train = _read(name, train_files, label_key, num_classes, archive)
    test = _read(name, test_files, label_key, num_classes, archive)
    return {"train_x": train[0], "train_y": train[1], "test_x": test[0], "test_y": test[1]}
