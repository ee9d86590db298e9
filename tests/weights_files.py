"""Weights files for tests without a download: a timm ViT's state dict made to look trained (its LayerNorms moved
off their initial 1 and 0, which cfl flags as a fresh initialisation), and written in Google's big_vision
``.npz`` layout (the blocks stacked in one array per name, as timm's ``_load_weights`` reads it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def as_trained(state: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """``state`` with every LayerNorm weight and bias moved by a little noise (std 0.01), as training moves them."""
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.01 * torch.randn(v.shape, generator=gen) if ("norm" in k and v.is_floating_point()) else v
            for k, v in state.items()}


def big_vision_arrays(state: dict[str, torch.Tensor], heads: int) -> dict[str, np.ndarray]:
    """The arrays of ``state`` (a timm ViT's) under the big_vision names."""
    n = lambda t: t.detach().cpu().numpy()  # noqa: E731
    blocks = sorted({int(k.split(".")[1]) for k in state if k.startswith("blocks.")})
    dim = state["cls_token"].shape[-1]
    hd = dim // heads
    out = {"embedding/kernel": n(state["patch_embed.proj.weight"].permute(2, 3, 1, 0)),
           "embedding/bias": n(state["patch_embed.proj.bias"]), "cls": n(state["cls_token"]),
           "pos_embedding": n(state["pos_embed"]), "Transformer/encoder_norm/scale": n(state["norm.weight"]),
           "Transformer/encoder_norm/bias": n(state["norm.bias"])}
    per_block: dict[str, list[np.ndarray]] = {}
    for i in blocks:
        b = f"blocks.{i}."
        q, k, v = state[f"{b}attn.qkv.weight"].chunk(3)
        qb, kb, vb = state[f"{b}attn.qkv.bias"].chunk(3)
        mha = "Transformer/encoderblock/MultiHeadDotProductAttention_0/"
        items = {"Transformer/encoderblock/LayerNorm_0/scale": state[f"{b}norm1.weight"],
                 "Transformer/encoderblock/LayerNorm_0/bias": state[f"{b}norm1.bias"],
                 "Transformer/encoderblock/LayerNorm_1/scale": state[f"{b}norm2.weight"],
                 "Transformer/encoderblock/LayerNorm_1/bias": state[f"{b}norm2.bias"],
                 f"{mha}out/kernel": state[f"{b}attn.proj.weight"].reshape(dim, heads, hd).permute(1, 2, 0),
                 f"{mha}out/bias": state[f"{b}attn.proj.bias"]}
        for name, w, bias in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            items[f"{mha}{name}/kernel"] = w.T.reshape(dim, heads, hd)
            items[f"{mha}{name}/bias"] = bias.reshape(heads, hd)
        for r in range(2):
            items[f"Transformer/encoderblock/MlpBlock_0/Dense_{r}/kernel"] = state[f"{b}mlp.fc{r + 1}.weight"].T
            items[f"Transformer/encoderblock/MlpBlock_0/Dense_{r}/bias"] = state[f"{b}mlp.fc{r + 1}.bias"]
        for key, value in items.items():
            per_block.setdefault(key, []).append(n(value))
    out.update({k: np.stack(v) for k, v in per_block.items()})
    return out


def save_big_vision(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    np.savez(path, **arrays)
    return path
