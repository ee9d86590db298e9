"""The frozen backbone's features of every sample of a stream, computed once and cached on disk:
for methods whose backbone input does not depend on what trains (linear probing, fedncm's class means,
afcl's ridge regression, ranpac's on a random projection), the run trains only the head, on a stream of ``(D,)``
feature vectors.

The cache file is keyed by the backbone (cfl and timm names, timm's version), the weights file's SHA-256 (or the
seed of a random backbone), the preprocessing (size, mean/std, interpolation, the stream's range map) and the
raw stream's data fingerprint (:mod:`cfl.data.fingerprint`): a changed weights file, preprocessing or data
gives another key, so a stale file is never read. Each file holds its key and a SHA-256 of its tensors: a file
of another key (copied under this name), one whose tensors no longer give the digest (damaged), an older cfl's
file without them, or one that does not hold what the key promises (shapes, sizes, finite float32) is
recomputed, with a warning. A failed write (a full disk) removes its temporary file and is said; the run goes
on, and temporaries left by a killed run are removed at the next write.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from cfl.data.fingerprint import fingerprint
from cfl.data.load import root_dir
from cfl.data.stream import Stream, Task
from cfl.pretrained.loaded import INFO_KEY, RANDOM_SUFFIX, LoadedBackbone, loaded_backbone
from cfl.pretrained.preprocessing import prepared, unit_range

FEATURE_CACHE_VERSION = 1
#: images through the backbone at a time (inference only: the activations of one batch)
BATCH = 256
SPLITS = ("train", "test")


def cache_key(backbone: LoadedBackbone, stream: Stream, low: torch.Tensor, high: torch.Tensor) -> str:
    import timm

    described = {**backbone.describe(), "weights": None}  # the file's hash, not its path, names the weights
    text = json.dumps({"version": FEATURE_CACHE_VERSION, "timm": timm.__version__, "backbone": described,
                       "range": [low.tolist(), high.tolist()], "data": fingerprint(stream)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_path(data_root: str | None, backbone: LoadedBackbone, key: str) -> Path:
    return root_dir(data_root) / "cache" / "features" / f"{backbone.name}-{key}.pt"


@torch.inference_mode()
def compute_features(backbone: LoadedBackbone, x: torch.Tensor, low: torch.Tensor, high: torch.Tensor,
                     device: torch.device) -> torch.Tensor:
    """``(N, D)`` float32 features of ``x`` ``(N, C, H, W)``, in batches of :data:`BATCH`, on ``device``."""
    model = backbone.model.to(device)
    out = [model(prepared(x[i:i + BATCH].to(device), backbone.preprocessing, low.to(device), high.to(device)))
           .float().cpu() for i in range(0, len(x), BATCH)]
    return torch.cat(out) if out else torch.zeros(0, backbone.model.num_features)


def _problem(loaded: object, stream: Stream | None, width: int | None) -> str | None:
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


def feature_stream(cfg: Any, stream: Stream, device: torch.device, quiet: bool = False) -> Stream:
    """``stream`` with every input replaced by the frozen backbone's features (from the cache when it holds
    them), the backbone named in ``stream.info["backbone"]``; says on stderr where the features came from."""
    backbone = loaded_backbone(cfg)

    def say(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    for note in backbone.weights.notes:
        say(f"model.weights: {note}")
    if stream.augment is not None:
        say(f"features: stream {stream.name}'s train-time augmentation is not applied: the backbone's features of "
            "the unaugmented inputs are computed once")
    low, high = unit_range([t.train_x for t in stream.tasks])
    key = cache_key(backbone, stream, low, high)
    path = cache_path(cfg.data_root, backbone, key)
    width = backbone.model.num_features
    start = time.perf_counter()
    features, source = None, "computed"
    if path.is_file():
        try:
            loaded = torch.load(path, weights_only=True)
            problem = _foreign(loaded, key) or _problem(loaded["features"], stream, width)
        except Exception as err:  # noqa: BLE001 - a damaged cache file is recomputed, never fatal
            problem = f"is unreadable ({type(err).__name__}: {err})"
        if problem is None:
            features, source = loaded["features"], "loaded from the cache"
        else:
            warnings.warn(f"feature cache {path} {problem}; computing the features again", stacklevel=2)
    if features is None:
        features = [{split: compute_features(backbone, getattr(t, f"{split}_x"), low, high, device)
                     for split in SPLITS} for t in stream.tasks]
        _write(path, {"key": key, "digest": tensors_digest(features), "features": features}, say)
    seconds = time.perf_counter() - start
    samples = sum(len(f["train"]) + len(f["test"]) for f in features)
    flag = RANDOM_SUFFIX if backbone.weights.random else ""
    say(f"features: {backbone.name}{flag} at {backbone.preprocessing.size} px, {samples} samples of "
        f"{stream.num_tasks} tasks -> {width} each, {source} in {seconds:.1f} s ({path})")
    tasks = [Task(t.name, f["train"].to(t.train_x.device), t.train_y, f["test"].to(t.test_x.device), t.test_y,
                  list(t.classes)) for t, f in zip(stream.tasks, features, strict=True)]
    info = {k: v for k, v in stream.info.items() if k != "fingerprint"}
    info[INFO_KEY] = {**backbone.describe(), "features": {"source": source, "seconds": seconds, "cache": str(path),
                                                          "width": width}}
    return Stream(stream.name, stream.scenario, tasks, stream.classes_per_head, (width,), backbone.name, info)


def tensors_digest(features: list[dict[str, torch.Tensor]]) -> str:
    """SHA-256 of every feature tensor's dtype, shape and bytes, task by task and split by split."""
    h = hashlib.sha256()
    for entry in features:
        for split in SPLITS:
            x = entry[split].contiguous()
            h.update(f"{split}{x.dtype}{tuple(x.shape)}".encode())
            h.update(x.numpy().tobytes())
    return h.hexdigest()


def _foreign(loaded: object, key: str) -> str | None:
    """Why a cache file is not this key's intact file (None: it is): another key's (a copied file), an older cfl's
    (no key or digest), or tensors that no longer give the digest written with them (damaged)."""
    if not isinstance(loaded, dict) or not {"key", "digest", "features"} <= set(loaded):
        return "holds no key and digest (written by an older cfl, or not a feature cache)"
    if loaded["key"] != key:
        return f"is the cache of another backbone or data (key {loaded['key']}, this run's {key})"
    problem = _problem(loaded["features"], None, None)
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
        say(f"features: removed {len(stale)} temporary file(s) a killed run left in {folder} ({', '.join(stale)})")


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


def _write(path: Path, payload: dict[str, Any], say: Any) -> None:
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
        say(f"features: could not write the feature cache {path} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); computing them again on each run")


def with_backbone(cfg: Any, stream: Stream, device: torch.device, quiet: bool = False) -> Stream:
    """The stream a run trains on: for a pretrained backbone's model its features (``model.train: head``) or its
    images normalised for the backbone (``prompts``, ``lora``, ``all``), else ``stream`` itself."""
    from cfl.pretrained.backbones import is_backbone

    if not is_backbone(cfg.model.name):
        return stream
    if cfg.model.train != "head":  # trains through the backbone: its images, normalised for it
        from cfl.pretrained.image_stream import image_stream

        return image_stream(cfg, stream, quiet)
    return feature_stream(cfg, stream, device, quiet)


def backbone_results(results: dict[str, Any], stream: Stream) -> None:
    """results.json's ``backbone`` (name, weights, sha256, random, preprocessing, where the features came from)
    and, for a random backbone, ``random_backbone: true`` and the method suffixed "(random backbone)", which
    every table row and figure legend shows."""
    info = stream.info.get(INFO_KEY)
    if info is None:
        return
    results["backbone"] = info
    results["random_backbone"] = bool(info["random"])
    if info["random"] and not str(results["method"]).endswith(RANDOM_SUFFIX):
        results["method"] = f"{results['method']}{RANDOM_SUFFIX}"
    if info["random"] and "display_label" in results and not str(results["display_label"]).endswith(RANDOM_SUFFIX):
        results["display_label"] = f"{results['display_label']}{RANDOM_SUFFIX}"  # the legends' name
