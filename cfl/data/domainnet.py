"""DomainNet (Peng et al. 2019): 345 classes in six domains, with the official split lists:
``<data root>/domainnet/<domain>_train.txt`` and ``<domain>_test.txt``, each line ``<path> <label 0..344>``
with the path relative to ``domainnet/`` (e.g. ``clipart/aircraft_carrier/clipart_001_000001.jpg 0``), and the
images of each domain unpacked beside them (``domainnet/clipart/...``). One task per domain, in the
alphabetical order S-Prompts (Wang et al. 2022) uses for domain-incremental DomainNet."""

from __future__ import annotations

from pathlib import Path

from cfl.data.files import missing_data
from cfl.data.image_files import check_files

FOLDER = "domainnet"
DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
CLASSES = 345
LAYOUT = ("domainnet/<domain>_{train,test}.txt with lines '<domain>/<class>/<file>.jpg <label 0..344>', and "
          "domainnet/<domain>/")
Listing = tuple[list[Path], list[int]]


def how_to_get(root: Path) -> str:
    return (f"download the six domains' zip files and their txt split lists (http://ai.bu.edu/M3SDA/) and unpack "
            f"them into {root / FOLDER} so that it holds {LAYOUT}; see docs/data.md")


def split_list(root: Path, domain: str, split: str) -> Listing:
    """The image files and labels of ``<domain>_<split>.txt``; a missing list, a malformed line, a label outside
    0..344 or a listed file that is absent is refused naming the file."""
    path = root / FOLDER / f"{domain}_{split}.txt"
    if not path.is_file():
        raise missing_data("DomainNet", [path], how_to_get(root), "the split list is absent")
    files, labels = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) >= CLASSES:
            raise missing_data("DomainNet", [path], how_to_get(root), f"line {number} reads {line!r}; expected "
                                                                      f"'<path> <label 0..{CLASSES - 1}>'")
        files.append(root / FOLDER / parts[0])
        labels.append(int(parts[1]))
    if not files:
        raise missing_data("DomainNet", [path], how_to_get(root), "the split list holds no line")
    check_files("DomainNet", files, path, how_to_get(root))
    return files, labels


def domainnet_listing(root: Path, domain: str) -> tuple[Listing, Listing]:
    return split_list(root, domain, "train"), split_list(root, domain, "test")
