"""SVHN cropped digits from the standard ``train_32x32.mat`` / ``test_32x32.mat`` (Netzer et al. 2011).

``X`` is ``(32, 32, 3, N)`` uint8, ``y`` is ``(N, 1)`` with the digit 0 stored as label 10.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cfl.data.cache import Layout
from cfl.data.checks import check_images, check_labels
from cfl.data.files import locate, reading

SVHN_FILES = ("train_32x32.mat", "test_32x32.mat")
SVHN_LAYOUT = Layout((3, 32, 32), 10)
Split = tuple[torch.Tensor, torch.Tensor]


def read_svhn_mat(path: Path) -> Split:
    """uint8 images ``(N, 3, 32, 32)`` and int64 labels 0..9."""
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path))
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - scipy fails in many ways on a damaged file
        raise ValueError(f"{path}: not a readable MATLAB file ({type(err).__name__}: {err})") from err
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: lacks the variables X and y")
    x = np.transpose(mat["X"], (3, 2, 0, 1)) if mat["X"].ndim == 4 else mat["X"]
    check_images(path, x, (3, 32, 32))
    y = mat["y"].reshape(-1).astype(np.int64)
    check_labels(path, y, len(x), 1, 10)  # the digit 0 is stored as 10
    return torch.from_numpy(np.ascontiguousarray(x).astype(np.uint8)), torch.from_numpy(y % 10)


def svhn_files(root: Path, download: bool = False) -> list[Path]:
    """``train_32x32.mat`` and ``test_32x32.mat``; fails clearly when absent."""
    candidates = [root / "svhn", root / "SVHN", root]

    def fetch() -> None:
        import torchvision

        for split in ("train", "test"):
            torchvision.datasets.SVHN(str(candidates[0]), split=split, download=True)

    folder = locate("SVHN", candidates, SVHN_FILES, _how(candidates[0]), fetch if download else None)
    return [folder / f for f in SVHN_FILES]


def read_svhn(files: list[Path]) -> dict[str, torch.Tensor]:
    """uint8 ``train_x``/``test_x`` ``(N, 3, 32, 32)`` and labels 0..9 from :func:`svhn_files`' list."""
    with reading("SVHN", files, _how(files[0].parent)):
        (train_x, train_y), (test_x, test_y) = (read_svhn_mat(f) for f in files)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}


def _how(folder: Path) -> str:
    return ("set `stream.download: true` (needs network), or put train_32x32.mat and test_32x32.mat "
            f"(http://ufldl.stanford.edu/housenumbers/) in {folder}")
