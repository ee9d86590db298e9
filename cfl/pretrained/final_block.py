"""The last block of a frozen ViT computed for the rows its head reads only.

Every method on a frozen ViT reads a few rows of the last block's output: the [CLS] token (CODA-P, DualPrompt,
Powder, LoRA's pooled feature) or the prompt tokens (L2P's average). The other rows of that block are computed by
timm's ``Block.forward`` and thrown away. Here the last block computes the keys and values of every row (the kept
rows attend to all of them) but the queries, attention output, projection, MLP and both residuals of a window of
rows only: the same arithmetic for those rows, about 3/4 of the last block's products saved (ViT-Ti/16 at 224 px,
L2P's 222 tokens: one block's forward and backward 0.062 s against 0.016 s at batch 8, 2-core AMD EPYC, 1 thread).

The window is at least ``MIN_ROWS`` rows long: a product of one row takes another kernel than the full product
(its result differs in the last bits on the CPUs measured); from 4 rows on the results were equal bit for bit,
forward and backward (2-core AMD EPYC with AVX-512, torch 2.14.1), so runs keep their numbers."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from cfl.pretrained.prefix_attention import with_prefix

MIN_ROWS = 8


def window(rows: slice, tokens: int) -> slice:
    """A contiguous window of at least ``MIN_ROWS`` of the ``tokens`` rows that holds ``rows``."""
    start, stop = rows.start or 0, rows.stop
    if stop - start < MIN_ROWS:
        stop = min(tokens, start + MIN_ROWS)
        start = max(0, stop - MIN_ROWS)
    return slice(start, stop)


def is_plain(block: nn.Module) -> bool:
    """Whether ``block`` is timm's plain pre-norm ViT block, the form :func:`block_rows` computes."""
    attn = getattr(block, "attn", None)
    return all(hasattr(block, name) for name in ("norm1", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2")) \
        and attn is not None and getattr(attn, "gate", None) is None and hasattr(attn, "qkv")


def block_rows(block: nn.Module, x: torch.Tensor, rows: slice, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """timm ``Block.forward`` of ``x`` ``(N, T, D)`` at ``rows`` only, its attention's operations in their order
    (the explicit form, or torch's fused kernel where ``fused_attn``); ``prefix`` ``(N, 2, L, D)``: keys and values
    before the block's own, as :func:`cfl.pretrained.prefix_attention.prefixed_attention`."""
    attn = block.attn
    n, t, _ = x.shape
    heads, head_dim = attn.num_heads, attn.head_dim
    q, k, v = attn.qkv(block.norm1(x)).reshape(n, t, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if prefix is not None:
        k, v = with_prefix(prefix, k, v)
    q = q[:, :, rows]
    if getattr(attn, "fused_attn", False):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=attn.attn_drop.p if attn.training else 0.0)
    else:
        out = attn.attn_drop((q * attn.scale @ k.transpose(-2, -1)).softmax(dim=-1)) @ v
    out = out.transpose(1, 2).reshape(n, q.shape[2], heads * head_dim)
    y = x[:, rows] + block.drop_path1(block.ls1(attn.proj_drop(attn.proj(attn.norm(out)))))
    return y + block.drop_path2(block.ls2(block.mlp(block.norm2(y))))


def normed_rows(vit: nn.Module, x: torch.Tensor, rows: slice, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """``vit.norm(last_block(x))[:, rows]``, the last block computed over a window around ``rows`` only."""
    span = window(rows, x.shape[1])
    out = vit.norm(block_rows(vit.blocks[-1], x, span, prefix))
    return out[:, rows.start - span.start:rows.stop - span.start]


def pooled(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``vit(x)`` (timm's pooled pre-logits of a ViT built with ``num_classes=0``: the [CLS] token after the final
    norm) with the last block over a window around the [CLS] row only; timm's own forward where the backbone's last
    block or pooling is another."""
    if not has_token_pool(vit):
        return vit(x)
    tokens = vit.blocks[:-1](vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x)))))
    return vit.head(vit.head_drop(vit.fc_norm(normed_rows(vit, tokens, slice(0, 1))[:, 0])))


def has_token_pool(vit: nn.Module) -> bool:
    """Whether ``vit`` is a timm ViT whose last block is plain and whose pooled feature is its [CLS] token."""
    return is_plain(vit.blocks[-1]) and getattr(vit, "global_pool", None) == "token" and \
        getattr(vit, "attn_pool", None) is None
