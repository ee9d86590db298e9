"""What every reader checks on the arrays it decoded from one file: image shape, label range, counts.

Each check raises ``ValueError`` whose message starts with the file's path; the dataset readers turn it
into the data error of :func:`cfl.data.files.missing_data` (exit code 2), before any training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cfl.data.safe_pickle import ForbiddenGlobal, load_data_pickle

Array = np.ndarray | torch.Tensor


def check_images(path: Path | str, images: Array, shape: tuple[int, ...]) -> None:
    """``images`` is a non-empty ``(N, *shape)`` array (``path``: the file, or the cached tensor's key)."""
    if tuple(images.shape[1:]) != shape or len(images.shape) != len(shape) + 1:
        raise ValueError(f"{path}: images of shape {tuple(images.shape)}, expected (N, {', '.join(map(str, shape))})")
    if images.shape[0] == 0:
        raise ValueError(f"{path}: holds no images")


def check_labels(path: Path | str, labels: Array, count: int, low: int, high: int) -> None:
    """``labels`` is a vector of ``count`` integers in ``low..high``."""
    if len(labels.shape) != 1 or labels.shape[0] != count:
        raise ValueError(f"{path}: {tuple(labels.shape)} labels for {count} images")
    if count and (int(labels.min()) < low or int(labels.max()) > high):
        raise ValueError(f"{path}: labels {int(labels.min())}..{int(labels.max())}, expected {low}..{high}")


def load_pickle(path: Path, keys: tuple[str, ...], **kw: Any) -> dict[str, Any]:
    """The dict pickled in ``path`` (bytes keys decoded), holding at least ``keys``; anything else is a ValueError.

    Read by :class:`cfl.data.safe_pickle.DataUnpickler`: a pickle naming anything but numpy arrays and plain
    containers is refused before any of its code runs."""
    try:
        with open(path, "rb") as fh:
            obj = load_data_pickle(fh, **kw)
    except OSError:
        raise
    except ForbiddenGlobal as err:
        raise ValueError(f"{path}: refused: the pickle calls {err}, which no data file needs (cfl loads only numpy "
                         f"arrays, numbers, strings and containers from pickles, so that a file cannot run code); "
                         f"it is not a genuine dataset file") from None
    except Exception as err:  # noqa: BLE001 - unpickling can fail in many ways; all mean a damaged file
        raise ValueError(f"{path}: not a readable pickle ({type(err).__name__}: {err})") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: holds a {type(obj).__name__}, expected a dict with keys {', '.join(keys)}")
    obj = {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ValueError(f"{path}: the dict lacks {', '.join(missing)} (has {', '.join(map(str, obj))})")
    return obj
