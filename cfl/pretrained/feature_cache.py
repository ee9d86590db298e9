"""The disk cache of per-sample frozen-backbone outputs (the head's features, :mod:`cfl.pretrained.features`; the
prompt methods' queries, :mod:`cfl.pretrained.query_stream`): one file per backbone, weights, preprocessing and
data (:func:`cache_key`), holding its key and a SHA-256 of its tensors. A file of another key (copied under this
name), one whose tensors no longer give the digest (damaged), an older cfl's file without them, or one that does
not hold what the key promises (shapes, sizes, finite float32) is recomputed, with a warning. A failed write (a
full disk) removes its temporary file and is said; the run goes on, and temporaries left by a killed run are
removed at the next write."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cfl.data.fingerprint import fingerprint
from cfl.data.load import root_dir
from cfl.data.stream import Stream
from cfl.pretrained.loaded import LoadedBackbone

FEATURE_CACHE_VERSION = 1
#: images through the backbone at a time (inference only: the activations of one batch)
BATCH = 256
SPLITS = ("train", "test")


def cache_key(backbone: LoadedBackbone, stream: Stream, low: torch.Tensor, high: torch.Tensor,
              form: str | None = None) -> str:
    """The cache key of the features of ``stream`` (``form``: what else sets them, e.g. the prompt methods' queries
    of :mod:`cfl.pretrained.query_stream`; None: the head's features, this module's)."""
    import timm

    described = {**backbone.describe(), "weights": None}  # the file's hash, not its path, names the weights
    keyed = {"version": FEATURE_CACHE_VERSION, "timm": timm.__version__, "backbone": described,
             "range": [low.tolist(), high.tolist()], "data": fingerprint(stream)}
    text = json.dumps(keyed if form is None else {**keyed, "form": form}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_path(data_root: str | None, backbone: LoadedBackbone, key: str, folder: str = "features") -> Path:
    return root_dir(data_root) / "cache" / folder / f"{backbone.name}-{key}.pt"


def cached(path: Path, key: str, stream: Stream, width: int,
           compute: Callable[[], list[dict[str, torch.Tensor]]], say: Callable[[str], None]
           ) -> tuple[list[dict[str, torch.Tensor]], str]:
    """Per task, ``{"train", "test"}`` float32 ``(N, width)`` tensors from the cache file ``path`` when it is this
    ``key``'s intact file, else ``compute()``-d (with a warning when a file was there) and written; and where they
    came from."""
    if path.is_file():
        try:
            loaded = torch.load(path, weights_only=True)
            problem = foreign(loaded, key) or problem_of(loaded["features"], stream, width)
        except Exception as err:  # noqa: BLE001 - a damaged cache file is recomputed, never fatal
            problem = f"is unreadable ({type(err).__name__}: {err})"
        if problem is None:
            return loaded["features"], "loaded from the cache"
        warnings.warn(f"{path.parent.name} cache {path} {problem}; computing them again", stacklevel=3)
    features = compute()
    write_cache(path, {"key": key, "digest": tensors_digest(features), "features": features}, say)
    return features, "computed"


def problem_of(loaded: object, stream: Stream | None, width: int | None) -> str | None:
    """Why a loaded cache file's features cannot be used (None: they can); ``stream`` None: only that they are
    one dict of tensors per task."""
    if stream is None:
        ok = isinstance(loaded, list) and all(isinstance(e, dict) and all(isinstance(e.get(s), torch.Tensor)
                                                                           for s in SPLITS) for e in loaded)
        return None if ok else "holds no features of the expected form"
    if not isinstance(loaded, list) or len(loaded) != stream.num_tasks:
        return f"holds {type(loaded).__name__}, not one entry per task ({stream.num_tasks})"
    for t, (entry, task) in enumerate(zip(loaded, stream.tasks, strict=True)):
        for split in SPLITS:
            x, n = entry.get(split) if isinstance(entry, dict) else None, len(getattr(task, f"{split}_y"))
            if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or tuple(x.shape) != (n, width):
                return f"task {t} {split}: expected float32 features of shape {(n, width)}"
            if not bool(torch.isfinite(x).all()):
                return f"task {t} {split}: non-finite features"
    return None


def tensors_digest(features: list[dict[str, torch.Tensor]]) -> str:
    """SHA-256 of every feature tensor's dtype, shape and bytes, task by task and split by split."""
    h = hashlib.sha256()
    for entry in features:
        for split in SPLITS:
            x = entry[split].contiguous()
            h.update(f"{split}{x.dtype}{tuple(x.shape)}".encode())
            h.update(x.numpy().tobytes())
    return h.hexdigest()


def foreign(loaded: object, key: str) -> str | None:
    """Why a cache file is not this key's intact file (None: it is): another key's (a copied file), an older cfl's
    (no key or digest), or tensors that no longer give the digest written with them (damaged)."""
    if not isinstance(loaded, dict) or not {"key", "digest", "features"} <= set(loaded):
        return "holds no key and digest (written by an older cfl, or not a feature cache)"
    if loaded["key"] != key:
        return f"is the cache of another backbone or data (key {loaded['key']}, this run's {key})"
    problem = problem_of(loaded["features"], None, None)
    if problem is None and tensors_digest(loaded["features"]) != loaded["digest"]:
        return "holds features whose digest differs from the one written with them (the file is damaged)"
    return problem


def remove_stale_temporaries(folder: Path, say: Any) -> None:
    """Remove the temporary files (``*.tmp<pid>``) that a run killed while writing the cache left behind: those
    whose process is gone (a running one may still be writing its own)."""
    stale = []
    for tmp in folder.glob("*.tmp*"):
        pid = tmp.suffix.removeprefix(".tmp")
        if pid.isdigit() and not _running(int(pid)):
            tmp.unlink(missing_ok=True)
            stale.append(tmp.name)
    if stale:
        say(f"{folder.name}: removed {len(stale)} temporary file(s) a killed run left in {folder} ({', '.join(stale)})")


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def write_cache(path: Path, payload: dict[str, Any], say: Any) -> None:
    """Write the cache through a temporary file; a failure (a full disk: torch.save raises RuntimeError) removes
    the temporary and is said, and the run goes on with the features it computed."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent, say)
        torch.save(payload, tmp)
        tmp.replace(path)
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        what = path.parent.name  # "features" or "queries"
        say(f"{what}: could not write the {what[:-1]} cache {path} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); computing them again on each run")
