"""notMNIST (Bulatov 2011) from the common ``notMNIST_small/A..J/*.png`` layout: one folder per letter.

There is no official test split: within each letter, the readable files in sorted name order are dealt so
that every 5th one (index % 5 == 0) is a test image, the rest train. Unreadable PNGs (the public archive holds a
couple of empty files) are skipped.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from cfl.data.cache import Layout
from cfl.data.files import locate, missing_data

LETTERS = "ABCDEFGHIJ"
TEST_EVERY = 5
NOTMNIST_LAYOUT = Layout((28, 28), 10)


def _how(folder: Path) -> str:
    return (f"download notMNIST_small.tar.gz (http://yaroslavvb.com/upload/notMNIST/) and unpack it so that "
            f"{folder}/A .. J hold the PNGs (no automatic download exists)")


def notmnist_files(root: Path) -> list[Path]:
    """The ten letter folders A..J (their modification times key the tensor cache); fails clearly."""
    candidates = [root / "notMNIST_small", root / "notmnist" / "notMNIST_small", root / "notmnist"]
    folder = locate("notMNIST", candidates, LETTERS, _how(candidates[0]), present=Path.is_dir)
    return [folder / letter for letter in LETTERS]


def read_notmnist(letter_folders: list[Path]) -> dict[str, torch.Tensor]:
    """uint8 ``train_x``/``test_x`` ``(N, 28, 28)`` and labels 0..9 (A..J)."""
    from PIL import Image

    folder = letter_folders[0].parent
    how = _how(folder)
    xs: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    ys: dict[str, list[int]] = {"train": [], "test": []}
    skipped: list[Path] = []
    for label, letter in enumerate(LETTERS):
        readable = 0
        for png in sorted((folder / letter).glob("*.png")):
            try:
                with Image.open(png) as img:
                    pixels = np.asarray(img.convert("L").resize((28, 28)), dtype=np.uint8)
            except (OSError, ValueError):
                skipped.append(png)
                continue
            split = "test" if readable % TEST_EVERY == 0 else "train"
            readable += 1
            xs[split].append(pixels)
            ys[split].append(label)
        if readable < 2:
            raise missing_data("notMNIST", [folder / letter], how,
                               f"{readable} readable PNG files for the letter {letter}; at least 2 are needed "
                               f"(one test, one train image)")
    if skipped:
        warnings.warn(f"notMNIST: skipped {len(skipped)} unreadable PNG files (e.g. {skipped[0]})", stacklevel=2)

    return {f"{split}_{kind}": (torch.from_numpy(np.stack(xs[split])) if kind == "x"
                                 else torch.tensor(ys[split], dtype=torch.long))
            for split in ("train", "test") for kind in ("x", "y")}
