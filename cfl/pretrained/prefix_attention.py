"""Prefix tuning (Li & Liang, ACL 2021, as DualPrompt uses it, Wang et al., ECCV 2022, Sec. 4.2): a block of the
frozen timm ViT whose self-attention also attends to ``L`` learnt key and value vectors, ``softmax(q [P_k; K]^T /
sqrt(d)) [P_v; V]``; the sequence and its length are unchanged (the official code: google-research/l2p,
``models/prefix_attention.py``, which concatenates ``prefix[0]`` to the keys and ``prefix[1]`` to the values along
the sequence; the PyTorch port's ``PreT_Attention``). The prefix joins after the keys' ``k_norm`` (the identity in
the ViTs cfl loads, which have no qk-norm) and is not normed itself, as in both official codes."""

from __future__ import annotations

import torch
from torch import nn


def prefixed_block(block: nn.Module, x: torch.Tensor, prefix: torch.Tensor | None) -> torch.Tensor:
    """timm ``Block.forward`` of ``x`` ``(N, T, D)`` with ``prefix`` ``(N, 2, L, D)`` (keys, values) in its
    attention; ``None``: the block unchanged."""
    if prefix is None:
        return block(x)
    x = x + block.drop_path1(block.ls1(prefixed_attention(block.attn, block.norm1(x), prefix)))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def prefixed_attention(attn: nn.Module, x: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """timm ``Attention.forward`` (the explicit, non-fused form) with ``prefix[:, 0]`` before the keys and
    ``prefix[:, 1]`` before the values, each ``(N, L, D)`` split into the attention's heads."""
    if getattr(attn, "gate", None) is not None:
        raise ValueError("prefix tuning is defined here for timm's plain ViT attention; this one is gated")
    n, t, _ = x.shape
    heads, head_dim = attn.num_heads, attn.head_dim
    q, k, v = attn.qkv(x).reshape(n, t, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    k, v = with_prefix(prefix, k, v)
    weights = attn.attn_drop((q * attn.scale @ k.transpose(-2, -1)).softmax(dim=-1))
    out = (weights @ v).transpose(1, 2).reshape(n, t, heads * head_dim)
    return attn.proj_drop(attn.proj(attn.norm(out)))


def with_prefix(prefix: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``(N, heads, T, hd)`` with ``prefix[:, 0]`` and ``prefix[:, 1]`` (``(N, L, D)`` each, split
    into the heads) before them along the sequence."""
    n, _, length, _ = prefix.shape
    heads, head_dim = k.shape[1], k.shape[3]
    pk, pv = prefix.reshape(n, 2, length, heads, head_dim).permute(1, 0, 3, 2, 4).unbind(0)  # (N, heads, L, hd)
    return torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
