"""The stream of a key-query prompt method (``model.train: prompts | components | dual-prompts``): each normalised
image packed with its frozen query (:mod:`cfl.pretrained.queries`), the queries computed once per sample or loaded
from their cache (``<data_root>/cache/queries``, keyed and checked as the feature cache); says on stderr where they
came from and what they cost."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from cfl.data.stream import Stream, Task
from cfl.pretrained.feature_cache import BATCH, SPLITS, cache_key, cache_path, cached
from cfl.pretrained.loaded import LoadedBackbone
from cfl.pretrained.preprocessing import MODES
from cfl.pretrained.queries import PackedLayout, compute_queries, packed, query_backbone

#: what the queries are besides the feature cache's key: the images of image_stream, resized in the model, through
#: the backbone with non-fused attention (a change here must change this text: another key)
QUERY_FORM = "queries v1: image_stream's normalised images, resized in the model, non-fused attention"


def query_stream(stream: Stream, raw: Stream, backbone: LoadedBackbone, low: torch.Tensor, high: torch.Tensor,
                 data_root: str | None, device: torch.device, quiet: bool = False) -> Stream:
    """``stream`` (the images normalised for ``backbone``; ``raw``: the stream they came from, which keys the
    cache) with every input row packed with its query; ``info["backbone"]["queries"]`` names the rows' layout
    (:func:`cfl.pretrained.queries.layout_of`)."""
    def say(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    pre = backbone.preprocessing
    width = backbone.model.num_features
    key = cache_key(backbone, raw, low, high, QUERY_FORM)
    path = cache_path(data_root, backbone, key, "queries")
    start = time.perf_counter()

    def compute() -> list[dict[str, torch.Tensor]]:  # a copy of the backbone only where the cache misses
        vit = query_backbone(backbone.model).to(device).eval()
        return [{split: compute_queries(vit, getattr(t, f"{split}_x").to(device), pre.size, MODES[pre.interpolation],
                                        BATCH).cpu() for split in SPLITS} for t in stream.tasks]

    queries, source = cached(path, key, stream, width, compute, say)
    seconds = time.perf_counter() - start
    layout = PackedLayout(tuple(stream.input_shape), width)
    samples = sum(len(q["train"]) + len(q["test"]) for q in queries)
    say(f"queries: the frozen {backbone.name} [CLS] query of each of {samples} samples ({stream.num_tasks} tasks, "
        f"{width} values each), {source} in {seconds:.1f} s ({path}); packed beside each image, so no step runs the "
        "frozen query pass")
    tasks = [Task(t.name, packed(t.train_x, q["train"].to(t.train_x.device)), t.train_y,
                  packed(t.test_x, q["test"].to(t.test_x.device)), t.test_y, list(t.classes))
             for t, q in zip(stream.tasks, queries, strict=True)]
    info: dict[str, Any] = dict(stream.info)
    backbone_info = dict(info["backbone"])
    backbone_info["queries"] = {"source": source, "seconds": seconds, "cache": str(path), **layout.describe()}
    info["backbone"] = backbone_info
    return Stream(stream.name, stream.scenario, tasks, stream.classes_per_head, (layout.row,), stream.default_model,
                  info)
