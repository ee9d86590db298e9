"""The stream a run trains through the backbone on (``model.train: prompts | lora | all``): each image mapped to
the backbone's normalisation at its own size, grayscale repeated to 3 channels; the model resizes it
(:class:`cfl.pretrained.adapted.AdaptedViT`). Per channel, ``(x - low) / (high - low)`` (the stream's training
range, :func:`cfl.pretrained.preprocessing.unit_range`) then ``(. - mean) / std``: one affine map per channel,
which commutes with resizing (bilinear and bicubic weights sum to 1), so this equals
:func:`cfl.pretrained.preprocessing.prepared` up to float rounding while the stream stays at its own size."""

from __future__ import annotations

import sys
from typing import Any

import torch

from cfl.data.stream import Stream, Task
from cfl.pretrained.loaded import INFO_KEY, LoadedBackbone, loaded_backbone
from cfl.pretrained.preprocessing import Preprocessing, unit_range
from cfl.pretrained.queries import QUERY_MODES


def normalised(x: torch.Tensor, pre: Preprocessing, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``x`` ``(N, C, H, W)`` (C 1 or 3) in the backbone's normalisation, 3 channels, same size."""
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"a pretrained backbone takes images (N, 1 or 3, H, W); the stream gives {tuple(x.shape)}")
    x = (x - low.view(1, -1, 1, 1)) / (high - low).view(1, -1, 1, 1)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    mean = torch.tensor(pre.mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(pre.std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous()


def image_stream(cfg: Any, stream: Stream, quiet: bool = False, device: torch.device | None = None) -> Stream:
    """``stream`` with its images normalised for the backbone; ``stream.info["backbone"]`` names it. For a
    key-query prompt method each image is packed with its frozen query (:mod:`cfl.pretrained.query_stream`),
    computed on ``device`` (None: the CPU)."""
    backbone: LoadedBackbone = loaded_backbone(cfg)
    for note in backbone.weights.notes:
        if not quiet:
            print(f"model.weights: {note}", file=sys.stderr, flush=True)
    low, high = unit_range([t.train_x for t in stream.tasks])
    pre = backbone.preprocessing
    tasks = [Task(t.name, normalised(t.train_x, pre, low, high), t.train_y, normalised(t.test_x, pre, low, high),
                  t.test_y, list(t.classes)) for t in stream.tasks]
    shape = (3, *tuple(stream.input_shape)[1:])
    info = {k: v for k, v in stream.info.items() if k != "fingerprint"}
    info[INFO_KEY] = {**backbone.describe(), "train": cfg.model.train,
                      "inputs": f"images normalised at {shape[1]}x{shape[2]} px, resized in the model to {pre.size}"}
    if stream.augment is not None and not quiet:
        print(f"inputs: stream {stream.name}'s train-time augmentation is not applied through a pretrained backbone "
              "(its padding value is the stream's own normalisation)", file=sys.stderr, flush=True)
    if not quiet:
        print(f"inputs: {stream.name}'s images normalised for {backbone.name} at their {shape[1]}x{shape[2]} px, "
              f"resized to {pre.size} px in each forward (model.train: {cfg.model.train})", file=sys.stderr,
              flush=True)
    images = Stream(stream.name, stream.scenario, tasks, stream.classes_per_head, shape, backbone.name, info)
    if cfg.model.train not in QUERY_MODES:
        return images
    from cfl.pretrained.query_stream import query_stream

    return query_stream(images, stream, backbone, low, high, cfg.data_root, device or torch.device("cpu"), quiet)
