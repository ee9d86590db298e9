"""The frozen query of the key-query prompt methods (``model.train: prompts | components | dual-prompts``: L2P,
CODA-P, DualPrompt, Fed-CPrompt): the frozen backbone's [CLS] feature of an input, which no trainable part touches.
The official codes (l2p-pytorch, CODA-P's, fed-mammoth's) run that frozen forward at every step, and cfl's L2P ran it
twice (the forward's selection and the key loss's); here it is computed **once per sample** when the run starts and
carried beside the image in each input row, so a step runs only the prompted forward and its backward.

A packed row holds the normalised image's ``C * H * W`` values, then the query's ``D``: ``(N, C*H*W + D)``. The rows
go wherever an image would (the batches, replay memories, the evaluation); the model unpacks them
(:class:`cfl.pretrained.adapted.AdaptedViT`). The queries come from the same operators as the per-step pass (the
backbone with timm's non-fused attention, on the image resized in the model's way), in batches of
:data:`cfl.pretrained.feature_cache.BATCH`: a query equals the per-step pass's to float rounding (a product's rows
round by their place in its batch: about 1e-6 at 32 px), bit for bit where the batch is the same (both checked in
tests/pretrained/test_queries.py). They are cached on disk like the features (:mod:`cfl.pretrained.features`:
keyed by backbone, weights, preprocessing and data; checked by key and digest; recomputed, with a warning, when the
file is not this key's intact file). A pretrained stream never augments (:mod:`cfl.pretrained.image_stream`), so the
query of a sample never changes; a method that changes the shared backbone would make them stale, and is refused
(:mod:`cfl.engine.rounds.shared_backbone`)."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from cfl.pretrained.final_block import pooled

#: the ``model.train`` modes whose forward reads the frozen query
QUERY_MODES = ("prompts", "components", "task-components", "dual-prompts")


def resized(x: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """``x`` ``(..., C, H, W)`` resized to ``size`` px with ``mode`` (itself when it is that size already)."""
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    return F.interpolate(x, size=(size, size), mode=mode, **({} if mode == "nearest" else {"align_corners": False}))


def query_backbone(vit: nn.Module) -> nn.Module:
    """A copy of the timm ViT ``vit`` with the attention the adapted model runs (non-fused), for inference."""
    copied = copy.deepcopy(vit)
    for block in copied.blocks:
        block.attn.fused_attn = False
    return copied.requires_grad_(False)


@torch.no_grad()
def compute_queries(vit: nn.Module, x: torch.Tensor, size: int, mode: str, batch: int) -> torch.Tensor:
    """``(N, D)`` queries of the normalised images ``x`` ``(N, C, H, W)``: ``vit`` (from :func:`query_backbone`) on
    each image resized to ``size`` px, ``batch`` images at a time."""
    out = [pooled(vit, resized(x[i:i + batch], size, mode)).float() for i in range(0, len(x), batch)]
    return torch.cat(out) if out else torch.zeros(0, vit.num_features)


def packed(images: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Rows ``(N, C*H*W + D)``: each image's values, then its query's."""
    return torch.cat([images.flatten(1), queries.to(images.dtype)], 1).contiguous()


class PackedLayout:
    """How a packed row splits: the image shape ``(C, H, W)`` and the query width ``D``."""

    def __init__(self, image_shape: tuple[int, ...], width: int) -> None:
        self.image_shape, self.width = tuple(image_shape), width
        self.image_values = math.prod(self.image_shape)

    @property
    def row(self) -> int:
        return self.image_values + self.width

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``(..., row)`` as the images ``(..., C, H, W)`` and the queries ``(..., D)``."""
        if x.shape[-1] != self.row:
            raise ValueError(f"the model takes packed rows of {self.image_values} image values "
                             f"{self.image_shape} and a {self.width}-value query ({self.row} in all), got an input of "
                             f"shape {tuple(x.shape)}: feed it the run's stream "
                             "(cfl.pretrained.features.with_backbone)")
        images = x[..., :self.image_values].reshape(*x.shape[:-1], *self.image_shape)
        return images, x[..., self.image_values:]

    def describe(self) -> dict[str, object]:
        return {"image_shape": list(self.image_shape), "query_width": self.width}


def layout_of(stream_info: dict) -> PackedLayout | None:
    """The packed layout a stream's ``info`` names (:mod:`cfl.pretrained.query_stream`), or None."""
    queries = stream_info.get("backbone", {}).get("queries")
    return None if queries is None else PackedLayout(tuple(queries["image_shape"]), int(queries["query_width"]))
