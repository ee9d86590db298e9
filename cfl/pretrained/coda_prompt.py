"""CODA-Prompt's prompt components (Smith et al., CVPR 2023, "CODA-Prompt: COntinual Decomposed Attention-based
Prompting for Rehearsal-Free Continual Learning", Sec. 4; official code github.com/GT-RIPL/CODA-Prompt,
models/zoo.py ``CodaPrompt``): ``pool`` components ``P_m`` of ``length`` tokens, each with a key ``K_m`` and an
attention vector ``A_m``. A query ``q`` (the frozen backbone's [CLS] feature) weights component ``m`` by
``alpha_m = cos(q * A_m, K_m)`` (``*`` elementwise) and its prompt is ``sum_m alpha_m P_m``: every weight is
differentiable, so keys and attention vectors train end to end with the task loss (no surrogate key loss).
:func:`orthogonality` is the paper's penalty ``mean((B B^T - I)^2)`` on keys, attention vectors and flattened
components. The three start with orthonormal rows (as the code's Gram-Schmidt initialisation gives).

Two forms (``model.component_layers``): prompt tuning (0: the weighted prompt prepended after [CLS]; tensors
``(pool, length, D)``, ``(pool, D)``, ``(pool, D)``), or prefix tuning in the first ``layers`` blocks (the official
code: layers 0-4, one component set per layer; tensors ``(pool, layers, length, D)``, ``(pool, layers, D)``,
``(pool, layers, D)``, the pool first in both so that a task's slice of components is a slice of rows). A layer's
prompt ``P`` of ``length`` tokens is its prefix: keys ``P[:, :length / 2]``, values ``P[:, length / 2:]`` (the
code's ``Ek``, ``Ev``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


def orthonormal_rows(rows: int, width: int) -> torch.Tensor:
    """``(rows, width)`` with orthonormal rows (while ``rows <= width``; else as many as fit, the rest random)."""
    q, _ = torch.linalg.qr(torch.randn(width, rows))
    return q.T.contiguous()


class ComponentPrompt(nn.Module):
    def __init__(self, pool: int, length: int, width: int, layers: int = 0) -> None:
        super().__init__()
        if layers and length % 2:
            raise ValueError(f"prefix tuning splits each prompt into key and value halves: prompt_length {length} is "
                             "odd; set an even prompt_length (the official 8)")
        self.length, self.layers = length, layers
        if not layers:  # prompt tuning: one set, drawn as before the prefix form existed (the same values)
            self.prompts = nn.Parameter(orthonormal_rows(pool, length * width).view(pool, length, width))
            self.keys = nn.Parameter(orthonormal_rows(pool, width))
            self.attention = nn.Parameter(orthonormal_rows(pool, width))
            return
        self.prompts = nn.Parameter(torch.stack([orthonormal_rows(pool, length * width).view(pool, length, width)
                                                 for _ in range(layers)], 1))
        self.keys = nn.Parameter(torch.stack([orthonormal_rows(pool, width) for _ in range(layers)], 1))
        self.attention = nn.Parameter(torch.stack([orthonormal_rows(pool, width) for _ in range(layers)], 1))

    def forward(self, query: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """Prompt tuning: the prompt of each query ``(N, D)``, ``(N, length, D)``; prefix tuning: per layer, the
        prefix ``(N, 2, length / 2, D)`` (keys, values) of each query."""
        if not self.layers:
            return torch.einsum("nm,mld->nld", component_weights(query, self.keys, self.attention), self.prompts)
        attended = F.normalize(query[:, None, None] * self.attention.unsqueeze(0), dim=-1, eps=1e-12)  # (N, M, l, D)
        weights = torch.einsum("nmld,mld->nml", attended, F.normalize(self.keys, dim=-1, eps=1e-12))
        prompts = torch.einsum("nml,mltd->nltd", weights, self.prompts)  # (N, layers, length, D)
        n, _, length, width = prompts.shape
        return list(prompts.view(n, self.layers, 2, length // 2, width).unbind(1))


def component_weights(query: torch.Tensor, keys: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """``alpha[n, m] = cos(query_n * attention_m, keys_m)``: ``(N, M)``."""
    attended = F.normalize(query.unsqueeze(1) * attention.unsqueeze(0), dim=-1, eps=1e-12)  # (N, M, D)
    return torch.einsum("nmd,md->nm", attended, F.normalize(keys, dim=-1, eps=1e-12))


def orthogonality(rows: torch.Tensor) -> torch.Tensor:
    """CODA-P's penalty on a ``(M, ...)`` tensor, flattened to ``B`` of M rows: ``mean((B B^T - I)^2)``."""
    b = rows.reshape(rows.shape[0], -1)
    return ((b @ b.T - torch.eye(b.shape[0], dtype=b.dtype, device=b.device)) ** 2).mean()


def visible_orthogonality(rows: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """:func:`orthogonality` of the rows where ``visible`` ``(M,)`` bool holds (the official code's ``K[0:f]``),
    written without reading ``visible``'s values (so it runs under ``vmap``)."""
    v = visible.to(rows.dtype)
    b = rows.reshape(rows.shape[0], -1) * v.unsqueeze(1)
    return ((b @ b.T - torch.diag(v)) ** 2).sum() / v.sum() ** 2


def layer_orthogonality(rows: torch.Tensor, layered: bool, visible: torch.Tensor | None = None) -> torch.Tensor:
    """The penalty summed over the layers of a prefix form's ``(M, layers, ...)`` tensor (the official code adds
    each prefix layer's); ``layered`` False: of the one set. ``visible``: over those rows only, else every row."""
    sets = [rows[:, i] for i in range(rows.shape[1])] if layered else [rows]
    return sum(orthogonality(s) if visible is None else visible_orthogonality(s, visible) for s in sets)
