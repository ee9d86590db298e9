"""SVHN cropped digits from the standard ``train_32x32.mat`` / ``test_32x32.mat`` (Netzer et al. 2011).

``X`` is ``(32, 32, 3, N)`` uint8, ``y`` is ``(N, 1)`` with the digit 0 stored as label 10.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cfl.data.files import first_with, missing_data

SVHN_FILES = ("train_32x32.mat", "test_32x32.mat")
Split = tuple[torch.Tensor, torch.Tensor]


def read_svhn_mat(path: Path) -> Split:
    """uint8 images ``(N, 3, 32, 32)`` and int64 labels 0..9."""
    from scipy.io import loadmat

    mat = loadmat(str(path))
    x = np.ascontiguousarray(np.transpose(mat["X"], (3, 2, 0, 1))).astype(np.uint8)
    y = mat["y"].reshape(-1).astype(np.int64) % 10
    if len(x) != len(y):
        raise ValueError(f"{path}: {len(x)} images but {len(y)} labels")
    return torch.from_numpy(x), torch.from_numpy(y)


def svhn_files(root: Path, download: bool = False) -> list[Path]:
    """``train_32x32.mat`` and ``test_32x32.mat``; fails clearly when absent."""
    candidates = [root / "svhn", root / "SVHN", root]
    folder = first_with(candidates, SVHN_FILES)
    if folder is None and download:
        import torchvision

        try:
            for split in ("train", "test"):
                torchvision.datasets.SVHN(str(candidates[0]), split=split, download=True)
        except Exception as err:  # noqa: BLE001 - reported as the data error
            raise missing_data("SVHN", candidates, _how(candidates[0]), f"download failed: {err}") from err
        folder = first_with(candidates, SVHN_FILES)
    if folder is None:
        raise missing_data("SVHN", candidates, _how(candidates[0]))
    return [folder / f for f in SVHN_FILES]


def read_svhn(files: list[Path]) -> dict[str, torch.Tensor]:
    try:
        (train_x, train_y), (test_x, test_y) = (read_svhn_mat(f) for f in files)
    except (OSError, ValueError, KeyError) as err:
        raise missing_data("SVHN", files, _how(files[0].parent), f"cannot read: {err}") from err
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}


def _how(folder: Path) -> str:
    return ("set `stream.download: true` (needs network), or put train_32x32.mat and test_32x32.mat "
            f"(http://ufldl.stanford.edu/housenumbers/) in {folder}")
