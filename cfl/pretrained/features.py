"""The frozen backbone's features of every sample of a stream, computed once and cached on disk:
for methods whose backbone input does not depend on what trains (linear probing, fedncm's class means,
afcl's ridge regression, ranpac's on a random projection), the run trains only the head, on a stream of ``(D,)``
feature vectors.

The cache file is keyed by the backbone (cfl and timm names, timm's version), the weights file's SHA-256 (or the
seed of a random backbone), the preprocessing (size, mean/std, interpolation, the stream's range map) and the
raw stream's data fingerprint (:mod:`cfl.data.fingerprint`): a changed weights file, preprocessing or data
gives another key, so a stale file is never read; the file's checks are :mod:`cfl.pretrained.feature_cache`'s.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from cfl.data.stream import Stream, Task
from cfl.pretrained.feature_cache import BATCH, SPLITS, cache_key, cache_path, cached
from cfl.pretrained.final_block import pooled
from cfl.pretrained.flags import RANDOM_SUFFIX, origin_suffix
from cfl.pretrained.loaded import INFO_KEY, LoadedBackbone, loaded_backbone
from cfl.pretrained.preprocessing import prepared, unit_range


@torch.inference_mode()
def compute_features(backbone: LoadedBackbone, x: torch.Tensor, low: torch.Tensor, high: torch.Tensor,
                     device: torch.device) -> torch.Tensor:
    """``(N, D)`` float32 features of ``x`` ``(N, C, H, W)``, in batches of :data:`BATCH`, on ``device`` (the last
    block over the [CLS] row's window only, cfl/pretrained/final_block.py)."""
    model = backbone.model.to(device)
    out = [pooled(model, prepared(x[i:i + BATCH].to(device), backbone.preprocessing, low.to(device), high.to(device)))
           .float().cpu() for i in range(0, len(x), BATCH)]
    return torch.cat(out) if out else torch.zeros(0, backbone.model.num_features)


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
    features, source = cached(path, key, stream, width, lambda: [
        {split: compute_features(backbone, getattr(t, f"{split}_x"), low, high, device) for split in SPLITS}
        for t in stream.tasks], say)
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


def with_backbone(cfg: Any, stream: Stream, device: torch.device, quiet: bool = False) -> Stream:
    """The stream a run trains on: for a pretrained backbone's model its features (``model.train: head``) or its
    images normalised for the backbone (``prompts``, ``lora``, ``all``), else ``stream`` itself."""
    from cfl.pretrained.backbones import is_backbone

    if not is_backbone(cfg.model.name):
        return stream
    if cfg.model.train != "head":  # trains through the backbone: its images, normalised for it
        from cfl.pretrained.image_stream import image_stream

        return image_stream(cfg, stream, quiet, device)
    return feature_stream(cfg, stream, device, quiet)


def backbone_results(results: dict[str, Any], stream: Stream, origin: str | None = None) -> None:
    """results.json's ``backbone`` (name, weights, sha256, random, preprocessing, where the features came from,
    the ``origin`` of its weights file: ``model.weights_origin``) and the method suffixed, which every table row
    and figure legend shows: "(random backbone)" (with ``random_backbone: true``) for a random backbone, the
    origin in parentheses for a file given one."""
    info = stream.info.get(INFO_KEY)
    if info is None:
        return
    results["backbone"] = {**info, "origin": origin} if origin else info
    results["random_backbone"] = bool(info["random"])
    suffix = RANDOM_SUFFIX if info["random"] else origin_suffix(origin)
    for key in ("method", "display_label"):  # the tables' and the legends' names
        if suffix and key in results and not str(results[key]).endswith(suffix):
            results[key] = f"{results[key]}{suffix}"
