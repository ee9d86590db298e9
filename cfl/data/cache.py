"""Decode a dataset once, then load its tensors from a ``.pt`` file keyed by the source files.

The key hashes each source file's resolved path, size and modification time (plus a format version), so
replacing or editing a file rebuilds the cache. The cache lives in ``<data root>/cache/``; when that is
not writable the tensors are simply rebuilt on each run. A loaded cache passes the reader's own checks again
(its :class:`Layout`: image shape, uint8 pixels, int64 labels in range), so a cache file edited or written by
something else is never trusted: it is rebuilt from the data files, whose reader refuses bad data.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from cfl.data.checks import check_images, check_labels

CACHE_VERSION = 2  # raised whenever the readers or their checks change, so that older cache files are rebuilt
Tensors = dict[str, torch.Tensor]
SPLIT_KEYS = ("train_x", "train_y", "test_x", "test_y")


def cache_key(name: str, sources: Iterable[Path]) -> str:
    digest = hashlib.sha256(f"{name}:{CACHE_VERSION}".encode())
    for src in sorted(Path(s).resolve() for s in sources):
        st = src.stat()
        digest.update(f"|{src}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Layout:
    """What a reader decodes per split: uint8 images ``(N, *shape)`` and int64 labels in ``0..classes-1``
    (``classes`` None: any class id >= 0)."""

    shape: tuple[int, ...]
    classes: int | None


def cache_problem(loaded: object, keys: tuple[str, ...], layout: Layout | None = None) -> str | None:
    """Why a loaded cache file cannot be used (None: it can): it must map exactly ``keys`` to tensors, each
    split's images and labels equally many, and (``layout`` given) pass the reader's checks."""
    if not isinstance(loaded, dict) or set(loaded) != set(keys):
        found = sorted(map(str, loaded)) if isinstance(loaded, dict) else type(loaded).__name__
        return f"holds {found}, expected the keys {', '.join(keys)}"
    if not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        return "holds values that are not tensors"
    for k in keys:
        if k.endswith("_x") and k[:-1] + "y" in loaded and len(loaded[k]) != len(loaded[k[:-1] + "y"]):
            return f"holds {len(loaded[k])} {k} but {len(loaded[k[:-1] + 'y'])} {k[:-1]}y"
    return None if layout is None else _layout_problem(loaded, keys, layout)


def _layout_problem(loaded: Tensors, keys: tuple[str, ...], layout: Layout) -> str | None:
    high = (layout.classes or 2**62) - 1
    for x_key in (k for k in keys if k.endswith("_x")):
        y_key = x_key[:-1] + "y"
        x, y = loaded[x_key], loaded[y_key]
        try:
            check_images(x_key, x, layout.shape)
            if x.dtype != torch.uint8 or y.dtype != torch.int64:
                raise ValueError(f"{x_key} of type {x.dtype} and {y_key} of type {y.dtype}, expected uint8 and int64")
            check_labels(y_key, y, len(x), 0, high)
        except ValueError as err:
            return f"fails the reader's checks ({err})"
    return None


def cached_tensors(cache_dir: Path, name: str, sources: Iterable[Path], build: Callable[[], Tensors],
                   keys: tuple[str, ...] = SPLIT_KEYS, layout: Layout | None = None) -> Tensors:
    """``build()``'s tensors, stored as ``cache_dir/<name>-<key>.pt`` the first time and loaded afterwards.

    A cache file that cannot be read, does not hold ``keys`` or (``layout`` given: every dataset reader
    gives it) fails the reader's checks is rebuilt, with a warning."""
    sources = list(sources)
    path = cache_dir / f"{name}-{cache_key(name, sources)}.pt"
    if path.is_file():
        try:
            loaded = torch.load(path, weights_only=True)
            problem = cache_problem(loaded, keys, layout)
        except Exception as err:  # noqa: BLE001 - a damaged cache is rebuilt, never fatal
            problem = f"is unreadable ({type(err).__name__}: {err})"
        if problem is None:
            return loaded
        warnings.warn(f"tensor cache {path} {problem}; rebuilding it from the data files", stacklevel=2)
    tensors = build()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(tensors, tmp)
        tmp.replace(path)
    except OSError as err:
        warnings.warn(f"could not write the tensor cache {path}: {err}; rebuilding on each run", stacklevel=2)
    return tensors
