"""ImageNet-R (Hendrycks et al. 2021): 30,000 renditions (art, cartoons, sketches, ...) of 200 ImageNet classes,
as unpacked from imagenet-r.tar: ``<data root>/imagenet-r/<wnid>/*.jpg``, one folder per class.

There is no official split. The prompt papers' code (CODA-Prompt, github.com/GT-RIPL/CODA-Prompt,
dataloaders/splits/imagenet-r_{train,test}.yaml) ships one random 80/20 split of all images, 24,000 train and
6,000 test, drawn over the whole set (not per class). cfl draws its own the same way, with a fixed seed so that it
is a property of the data and not of the run: the files in sorted path order, permuted by
``np.random.RandomState(0).permutation``, the first ``int(0.8 N)`` for training. Classes are numbered by sorted
wnid (CODA-P's lists number them in a file-system order that cannot be reproduced)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cfl.data.files import missing_data

FOLDER = "imagenet-r"
SUFFIXES = (".jpg", ".jpeg", ".png")
SPLIT_SEED, TRAIN_FRACTION = 0, 0.8
LAYOUT = "imagenet-r/<wnid>/*.jpg (one folder per class, 200 classes, as unpacked from imagenet-r.tar)"
Listing = tuple[list[Path], list[int]]


def how_to_get(root: Path) -> str:
    return (f"unpack imagenet-r.tar (https://github.com/hendrycks/imagenet-r) so that {root / FOLDER} holds "
            f"the layout {LAYOUT}; see docs/data.md")


def imagenet_r_listing(root: Path) -> tuple[Listing, Listing]:
    """(train, test) lists of image files and labels, split as the module doc says; refuses a missing folder,
    a folder without class folders or a class folder without images."""
    folder = root / FOLDER
    if not folder.is_dir():
        raise missing_data("ImageNet-R", [folder], how_to_get(root), "the folder is absent")
    classes = sorted(p for p in folder.iterdir() if p.is_dir())
    if not classes:
        raise missing_data("ImageNet-R", [folder], how_to_get(root), f"{folder} holds no class folder; expected "
                                                                     f"{LAYOUT}")
    files, labels = [], []
    for label, wnid in enumerate(classes):
        images = sorted(p for p in wnid.iterdir() if p.suffix.lower() in SUFFIXES)
        if not images:
            raise missing_data("ImageNet-R", [wnid], how_to_get(root), f"the class folder {wnid} holds no "
                                                                       f"{'/'.join(SUFFIXES)} image; expected {LAYOUT}")
        files += images
        labels += [label] * len(images)
    order = np.random.RandomState(SPLIT_SEED).permutation(len(files))
    cut = int(TRAIN_FRACTION * len(files))
    return tuple(([files[i] for i in rows], [labels[i] for i in rows]) for rows in (order[:cut], order[cut:]))
