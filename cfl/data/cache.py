"""Decode a dataset once, then load its tensors from a ``.pt`` file keyed by the source files.

The key hashes each source file's resolved path, size and modification time (plus a format version), so
replacing or editing a file rebuilds the cache. The cache lives in ``<data root>/cache/``; when that is
not writable the tensors are simply rebuilt on each run.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

CACHE_VERSION = 1
Tensors = dict[str, torch.Tensor]


def cache_key(name: str, sources: Iterable[Path]) -> str:
    digest = hashlib.sha256(f"{name}:{CACHE_VERSION}".encode())
    for src in sorted(Path(s).resolve() for s in sources):
        st = src.stat()
        digest.update(f"|{src}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def cached_tensors(cache_dir: Path, name: str, sources: Iterable[Path], build: Callable[[], Tensors]) -> Tensors:
    """``build()``'s tensors, stored as ``cache_dir/<name>-<key>.pt`` the first time and loaded afterwards."""
    sources = list(sources)
    path = cache_dir / f"{name}-{cache_key(name, sources)}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged cache is rebuilt, never fatal
            pass
    tensors = build()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(tensors, tmp)
        tmp.replace(path)
    except OSError as err:
        warnings.warn(f"could not write the tensor cache {path}: {err}; rebuilding on each run", stacklevel=2)
    return tensors
