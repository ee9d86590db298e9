"""CUB-200-2011 (Wah et al. 2011): 11,788 bird photographs of 200 species, as unpacked from CUB_200_2011.tgz:
``<data root>/CUB_200_2011/`` holding ``images.txt`` (``<id> <path under images/>``), ``image_class_labels.txt``
(``<id> <class 1..200>``), ``train_test_split.txt`` (``<id> <1 train | 0 test>``) and ``images/``. The official
split (5,994 train, 5,794 test) is used; classes are numbered 0..199 (the file's 1..200 minus one)."""

from __future__ import annotations

from pathlib import Path

from cfl.data.files import missing_data
from cfl.data.image_files import check_files

FOLDER = "CUB_200_2011"
LISTS = ("images.txt", "image_class_labels.txt", "train_test_split.txt")
LAYOUT = ("CUB_200_2011/{images.txt: '<id> <path>', image_class_labels.txt: '<id> <class 1..200>', "
          "train_test_split.txt: '<id> <1|0>', images/<path>}")
Listing = tuple[list[Path], list[int]]


def how_to_get(root: Path) -> str:
    return (f"unpack CUB_200_2011.tgz (https://www.vision.caltech.edu/datasets/cub_200_2011/) into {root} so that "
            f"it holds {LAYOUT}; see docs/data.md")


def _pairs(path: Path, root: Path, values: str) -> dict[str, str]:
    """``<id> <value>`` lines of ``path``; a line of another form is refused naming the file and the line."""
    if not path.is_file():
        raise missing_data("CUB-200", [path], how_to_get(root), "the file is absent")
    out = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise missing_data("CUB-200", [path], how_to_get(root), f"line {number} reads {line!r}; expected "
                                                                    f"'<image id> <{values}>'")
        out[parts[0]] = parts[1]
    return out


def _int(path: Path, root: Path, image: str, text: str, low: int, high: int) -> int:
    if not text.isdigit() or not low <= int(text) <= high:
        raise missing_data("CUB-200", [path], how_to_get(root), f"image {image} has {text!r}; expected an integer "
                                                                f"{low}..{high}")
    return int(text)


def cub_listing(root: Path) -> tuple[Listing, Listing]:
    """(train, test) lists of image files and labels 0..199 from the three lists of the layout."""
    folder = root / FOLDER
    lists = [folder / name for name in LISTS]
    paths, labels, split = (_pairs(p, root, v) for p, v in zip(lists, ("path", "class 1..200", "1 or 0"), strict=True))
    for path, table in zip(lists[1:], (labels, split), strict=True):
        if set(table) != set(paths):
            odd = sorted(set(table) ^ set(paths))[0]
            raise missing_data("CUB-200", [lists[0], path], how_to_get(root), f"image id {odd} is in only one of "
                                                                              f"{LISTS[0]} and {path.name}")
    out: tuple[Listing, Listing] = (([], []), ([], []))
    for image, rel in paths.items():
        part = out[0] if _int(lists[2], root, image, split[image], 0, 1) == 1 else out[1]
        part[0].append(folder / "images" / rel)
        part[1].append(_int(lists[1], root, image, labels[image], 1, 200) - 1)
    check_files("CUB-200", out[0][0] + out[1][0], lists[0], how_to_get(root))
    return out
