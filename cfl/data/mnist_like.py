"""MNIST and Fashion-MNIST from their four standard IDX files, gzipped or not, cached as tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from cfl.data.cache import Layout, cached_tensors
from cfl.data.checks import check_images, check_labels
from cfl.data.files import find_one, locate, reading
from cfl.data.idx import read_idx

Split = tuple[torch.Tensor, torch.Tensor]
IDX_FILES = {
    "train_x": "train-images-idx3-ubyte.gz|train-images-idx3-ubyte|train-images.idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte.gz|train-labels-idx1-ubyte|train-labels.idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte.gz|t10k-images-idx3-ubyte|t10k-images.idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte.gz|t10k-labels-idx1-ubyte|t10k-labels.idx1-ubyte",
}
IDX_LAYOUT = Layout((28, 28), 10)


@dataclass(frozen=True)
class IdxDataset:
    """Where one IDX dataset may live under the data root, its torchvision class and its statistics."""

    name: str
    folders: tuple[str, ...]  # relative to the data root, tried in order
    system_folders: tuple[str, ...]  # absolute, tried after the data root
    torchvision_class: str
    mean: float
    std: float

    def candidates(self, root: Path) -> list[Path]:
        return [root / f for f in self.folders] + [Path(f) for f in self.system_folders]


MNIST = IdxDataset("MNIST", ("mnist", "MNIST/raw"), (), "MNIST", 0.1307, 0.3081)
FASHION_MNIST = IdxDataset("Fashion-MNIST", ("fashion-mnist", "FashionMNIST/raw"),
                           ("/usr/share/datasets/fashion-mnist",), "FashionMNIST", 0.2860, 0.3530)


def _download(ds: IdxDataset, root: Path) -> None:
    import torchvision

    cls = getattr(torchvision.datasets, ds.torchvision_class)
    for train in (True, False):
        cls(str(root), train=train, download=True)


def idx_folder(ds: IdxDataset, root: Path, download: bool = False) -> Path:
    """The first folder holding the four IDX files (downloaded first when allowed); fails clearly."""
    return locate(ds.name, ds.candidates(root), IDX_FILES.values(), _how(ds, root),
                  (lambda: _download(ds, root)) if download else None)


def load_idx_raw(ds: IdxDataset, root: Path, download: bool = False) -> dict[str, torch.Tensor]:
    """The uint8 images ``(N, 28, 28)`` and int64 labels of both splits, decoded once then cached."""
    folder = idx_folder(ds, root, download)
    sources = {k: find_one(folder, names) for k, names in IDX_FILES.items()}

    def build() -> dict[str, torch.Tensor]:
        out = {}
        for key, path in sources.items():  # images before their labels
            images = key.replace("_y", "_x")
            with reading(ds.name, sorted({sources[images], path}, key=str), _how(ds, root)):  # type: ignore[arg-type]
                out[key] = read_idx(path)  # type: ignore[arg-type]
                if key == images:
                    check_images(path, out[key], (28, 28))  # type: ignore[arg-type]
                else:
                    check_labels(path, out[key], len(out[images]), 0, 9)  # type: ignore[arg-type]
        return {k: v if k.endswith("_x") else v.long() for k, v in out.items()}

    return cached_tensors(root / "cache", ds.name.lower(), sources.values(), build,  # type: ignore[arg-type]
                          layout=IDX_LAYOUT)


def load_idx(ds: IdxDataset, root: Path, download: bool = False) -> tuple[Split, Split]:
    """Both splits as float ``(N, 1, 28, 28)`` normalised with the dataset's mean/std, and labels."""
    raw = load_idx_raw(ds, root, download)

    def norm(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32).sub_(ds.mean * 255.0).div_(ds.std * 255.0).unsqueeze(1)  # in place: fast

    return (norm(raw["train_x"]), raw["train_y"]), (norm(raw["test_x"]), raw["test_y"])


def _how(ds: IdxDataset, root: Path) -> str:
    extra = " (Debian/Ubuntu: apt-get install dataset-fashion-mnist)" if ds is FASHION_MNIST else ""
    return (f"set `stream.download: true` (needs network), or put the four IDX files "
            f"(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
            f"t10k-labels-idx1-ubyte.gz; gzipped or not) in {root / ds.folders[0]}{extra}")
