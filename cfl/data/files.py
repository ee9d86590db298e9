"""Finding a dataset's files under the data root, and the error raised when they are not there."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from cfl.config.schema import ConfigError


def missing_data(dataset: str, looked: Iterable[Path], how: str, detail: str = "") -> ConfigError:
    """The one message for absent or unreadable data: dataset, paths looked at, how to get the files."""
    where = "\n".join(f"  - {p}" for p in looked)
    extra = f" ({detail})" if detail else ""
    return ConfigError(f"{dataset}: data files not found, unreadable or invalid{extra}. Looked in:\n{where}\n"
                       f"To get them: {how}\n(data root: config `data_root`, else $CFL_DATA, else ~/.cache/cfl; "
                       f"see docs/data.md)")


def locate(dataset: str, candidates: list[Path], names: Iterable[str], how: str,
           download: Callable[[], object] | None = None, present: Callable[[Path], bool] = Path.is_file) -> Path:
    """The first of ``candidates`` holding every one of ``names`` (see :func:`find_one`); when none does and
    ``download`` is given, it runs and the candidates are searched again. Refuses with :func:`missing_data`
    (the candidates and ``how``; a failed download's own error as the detail) when the files are not there."""
    names = list(names)
    folder = first_with(candidates, names, present)
    if folder is None and download is not None:
        try:
            download()
        except Exception as err:  # noqa: BLE001 - any download failure becomes the data error below
            raise missing_data(dataset, candidates, how, f"download failed: {err}") from err
        folder = first_with(candidates, names, present)
    if folder is None:
        raise missing_data(dataset, candidates, how)
    return folder


def first_with(candidates: Iterable[Path], names: Iterable[str],
               present: Callable[[Path], bool] = Path.is_file) -> Path | None:
    """The first candidate folder holding every one of ``names`` (each name may list alternatives with '|')."""
    names = list(names)
    for folder in candidates:
        if all(find_one(folder, n, present) is not None for n in names):
            return folder
    return None


def find_one(folder: Path, name: str, present: Callable[[Path], bool] = Path.is_file) -> Path | None:
    """``folder/alt`` for the first alternative in ``name`` ('a|b') that is ``present`` (a file), else None."""
    for alt in name.split("|"):
        path = folder / alt
        if present(path):
            return path
    return None


@contextmanager
def reading(dataset: str, files: list[Path], how: str,
            errors: tuple[type[Exception], ...] = (OSError, ValueError)) -> Iterator[None]:
    """Turn a reader's ``errors`` (a damaged or invalid file) into :func:`missing_data` naming ``files``."""
    try:
        yield
    except errors as err:
        raise missing_data(dataset, files, how, f"cannot read: {err}") from err


def require_classes(dataset: str, files: list[Path], raw: dict[str, torch.Tensor], needed: int, how: str) -> None:
    """Refuse decoded data whose train or test split lacks one of the classes ``0..needed-1`` a stream cuts."""
    for split in ("train", "test"):
        present = set(torch.unique(raw[f"{split}_y"]).tolist())
        missing = sorted(set(range(needed)) - present)
        if missing:
            raise missing_data(dataset, files, how, f"the {split} images hold {len(present)} classes, the stream's "
                                                    f"tasks need {needed} (class {missing[0]} is absent); lower "
                                                    f"stream.num_tasks or use the complete files")
