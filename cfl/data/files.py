"""Finding a dataset's files under the data root, and the error raised when they are not there."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cfl.schema import ConfigError


def missing_data(dataset: str, looked: Iterable[Path], how: str, detail: str = "") -> ConfigError:
    """The one message for absent or unreadable data: dataset, paths looked at, how to get the files."""
    where = "\n".join(f"  - {p}" for p in looked)
    extra = f" ({detail})" if detail else ""
    return ConfigError(f"{dataset}: data files not found or unreadable{extra}. Looked in:\n{where}\n"
                       f"To get them: {how}\n(data root: config `data_root`, else $CFL_DATA, else ~/.cache/cfl; "
                       f"see docs/data.md)")


def first_with(candidates: Iterable[Path], names: Iterable[str]) -> Path | None:
    """The first candidate folder holding every one of ``names`` (each name may list alternatives with '|')."""
    names = list(names)
    for folder in candidates:
        if all(find_one(folder, n) is not None for n in names):
            return folder
    return None


def find_one(folder: Path, name: str) -> Path | None:
    """``folder/alt`` for the first alternative in ``name`` ('a|b') that is a file, else None."""
    for alt in name.split("|"):
        path = folder / alt
        if path.is_file():
            return path
    return None
