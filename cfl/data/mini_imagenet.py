"""Mini-ImageNet (Vinyals et al. 2016; Ravi & Larochelle split): 100 classes of 84x84 RGB images.

Two accepted layouts under ``<data root>/mini-imagenet/``:

1. the widely shared pre-resized pickles ``mini-imagenet-cache-train.pkl``, ``-val.pkl``, ``-test.pkl``,
   each a dict with ``image_data`` (uint8 ``(N, 84, 84, 3)``) and ``class_dict`` (wnid -> list of row
   indices); all three are read and their 64 + 16 + 20 classes pooled;
2. a full ImageNet 2012 folder ``<data root>/imagenet/`` (``train/<wnid>/*.JPEG``), read through
   Avalanche's ``MiniImageNetDataset`` (its CSV file lists, images resized to 84x84).

Class ids follow Avalanche's ``MINI_IMAGENET_WNIDS`` order when the 100 standard classes are present
(sorted wnids otherwise). Within each class the images keep their file order; the last sixth (100 of 600)
is the test set, the rest train.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cfl.data.cache import Layout
from cfl.data.checks import check_images, load_pickle
from cfl.data.files import missing_data, reading

PICKLES = tuple(f"mini-imagenet-cache-{s}.pkl" for s in ("train", "val", "test"))
TEST_FRACTION_DENOMINATOR = 6  # 100 of each class's 600 images
MINI_LAYOUT = Layout((3, 84, 84), None)  # as many classes as the files hold


def how_to_get(root: Path) -> str:
    return (f"put mini-imagenet-cache-train.pkl, -val.pkl and -test.pkl in {root / 'mini-imagenet'}, or a full "
            f"ImageNet 2012 train folder (train/<wnid>/*.JPEG) in {root / 'imagenet'} (no automatic download "
            f"exists; see docs/data.md)")


def mini_imagenet_sources(root: Path) -> tuple[str, list[Path]]:
    """("pickle", the three pickles) or ("imagenet", [folder]); fails clearly when neither is there."""
    folder = root / "mini-imagenet"
    if all((folder / p).is_file() for p in PICKLES):
        return "pickle", [folder / p for p in PICKLES]
    imagenet = root / "imagenet"
    if (imagenet / "train").is_dir() or any(imagenet.glob("n0*")):
        return "imagenet", [imagenet]
    raise missing_data("Mini-ImageNet", [folder / p for p in PICKLES] + [imagenet], how_to_get(root))


def class_order(wnids: list[str]) -> list[str]:
    """Avalanche's class numbering for the standard 100 classes, sorted wnids for any other set."""
    if len(wnids) == 100:
        from avalanche.benchmarks.datasets.mini_imagenet.mini_imagenet_data import MINI_IMAGENET_WNIDS

        if set(wnids) == set(MINI_IMAGENET_WNIDS):
            return list(MINI_IMAGENET_WNIDS)
    return sorted(wnids)


def read_mini_imagenet_pickles(files: list[Path]) -> dict[str, torch.Tensor]:
    """uint8 ``train_x``/``test_x`` ``(N, 3, 84, 84)`` and labels, per-class split as in the module doc."""
    per_class: dict[str, np.ndarray] = {}
    for path in files:
        with reading("Mini-ImageNet", [path], how_to_get(path.parent.parent)):
            per_class.update(_read_pickle(path))
    return _split(per_class)


def _read_pickle(path: Path) -> dict[str, np.ndarray]:
    """One pickle's images per wnid, each class holding at least two images (one train, one test)."""
    data = load_pickle(path, ("image_data", "class_dict"))
    images, class_dict = np.asarray(data["image_data"]), data["class_dict"]
    check_images(path, images, (84, 84, 3))
    if images.dtype != np.uint8:
        raise ValueError(f"{path}: image_data of type {images.dtype}, expected uint8 pixels")
    if not isinstance(class_dict, dict) or not class_dict:
        raise ValueError(f"{path}: class_dict is a {type(class_dict).__name__}, expected a dict wnid -> row indices")
    out = {}
    for wnid, rows in class_dict.items():
        rows = np.asarray(rows)
        if rows.ndim != 1 or len(rows) < 2 or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(f"{path}: class {wnid!r} lists {rows.shape} rows; expected at least 2 image indices")
        if rows.min() < 0 or rows.max() >= len(images):
            raise ValueError(f"{path}: class {wnid!r} lists rows {rows.min()}..{rows.max()} of {len(images)} images")
        out[str(wnid)] = images[rows]
    return out


def read_mini_imagenet_folder(imagenet: Path) -> dict[str, torch.Tensor]:
    """Resize the 60,000 Mini-ImageNet images of a full ImageNet folder through Avalanche (slow, once)."""
    from avalanche.benchmarks.datasets.mini_imagenet.mini_imagenet import MiniImageNetDataset

    per_class_lists: dict[str, list[np.ndarray]] = {}
    with reading("Mini-ImageNet", [imagenet], how_to_get(imagenet.parent), (OSError, ValueError, KeyError, IndexError)):
        ds = MiniImageNetDataset(str(imagenet), split="all", resize_to=84)
        for i in range(len(ds)):
            img, target = ds[i]
            per_class_lists.setdefault(ds.wnids[target], []).append(np.asarray(img.convert("RGB"), dtype=np.uint8))
    if not per_class_lists:
        raise missing_data("Mini-ImageNet", [imagenet], how_to_get(imagenet.parent), "no Mini-ImageNet image found")
    return _split({w: np.stack(v) for w, v in per_class_lists.items()})


def _split(per_class: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    parts: dict[str, list] = {"train_x": [], "train_y": [], "test_x": [], "test_y": []}
    for label, wnid in enumerate(class_order(list(per_class))):
        images = per_class[wnid]
        n_test = max(1, len(images) // TEST_FRACTION_DENOMINATOR)
        cut = len(images) - n_test
        for split, chunk in (("train", images[:cut]), ("test", images[cut:])):
            parts[f"{split}_x"].append(torch.from_numpy(np.ascontiguousarray(chunk.transpose(0, 3, 1, 2))))
            parts[f"{split}_y"].append(torch.full((len(chunk),), label, dtype=torch.long))
    return {k: torch.cat(v) for k, v in parts.items()}
