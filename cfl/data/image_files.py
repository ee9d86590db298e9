"""Image datasets stored as one file per image (ImageNet-R, DomainNet, CUB-200): a list of (file, label) pairs
decoded on demand, one image at a time, into a preallocated uint8 tensor at a fixed stored size, then cached as
tensors under ``<data root>/cache/`` (:func:`cfl.data.cache.cached_tensors`, keyed by every listed file's path,
size and modification time). Only the images a run's tasks use are decoded; the run's float32 tensors are
checked against the machine's available memory before any image is decoded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from cfl.data.files import missing_data

#: the stored size: the pretrained ViTs' input size (224 px), as the prompt papers feed them
STORED_SIZE = 224
#: bytes a stored image costs in a run: its uint8 cache copy and its float32 normalised copy
BYTES_PER_VALUE = 1 + 4


def decode_resized(files: Sequence[Path], size: int, dataset: str, how: str) -> torch.Tensor:
    """uint8 ``(N, 3, size, size)``: each file decoded as RGB, its shorter side resized to ``size`` (bicubic)
    and centre-cropped to a square (the test transform of the prompt papers' code: Resize then CenterCrop).
    An unreadable image is refused naming the file."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    out = torch.empty((len(files), 3, size, size), dtype=torch.uint8)
    for i, path in enumerate(files):
        try:
            with Image.open(path) as img:
                square = ImageOps.fit(img.convert("RGB"), (size, size), Image.Resampling.BICUBIC)
        except (OSError, UnidentifiedImageError, ValueError) as err:
            raise missing_data(dataset, [path], how, f"cannot decode the image {path}: {err}") from err
        out[i] = torch.from_numpy(np.asarray(square, dtype=np.uint8).transpose(2, 0, 1).copy())
    return out


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where the file is absent: not Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(dataset: str, images: int, size: int, fix: str, available: int | None = None) -> None:
    """Refuse (before any image is decoded) a stream whose ``images`` at ``size`` px would not fit in the
    available memory: each costs ``3 size^2`` bytes as uint8 and four times that as float32."""
    need = images * 3 * size * size * BYTES_PER_VALUE
    free = available_memory() if available is None else available
    if free is not None and need > free:
        raise missing_data(dataset, [], fix, f"{images:,} images at {size}x{size} px need {need / 1e9:.1f} GB "
                                             f"(uint8 cache and float32 copy); {free / 1e9:.1f} GB is available")


def check_files(dataset: str, files: Sequence[Path], listed_in: Path, how: str) -> None:
    """Every listed image file exists; the first missing one is named with the list that names it."""
    for path in files:
        if not path.is_file():
            raise missing_data(dataset, [listed_in, path], how, f"{listed_in} lists {path}, which is not a file")
