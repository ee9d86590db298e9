"""CODA-Prompt's prompt components (Smith et al., CVPR 2023, "CODA-Prompt: COntinual Decomposed Attention-based
Prompting for Rehearsal-Free Continual Learning", Sec. 4; official code github.com/GT-RIPL/CODA-Prompt,
models/zoo.py ``CodaPrompt``): ``pool`` components ``P_m`` of ``length`` tokens, each with a key ``K_m`` and an
attention vector ``A_m``. A query ``q`` (the frozen backbone's [CLS] feature) weights component ``m`` by
``alpha_m = cos(q * A_m, K_m)`` (``*`` elementwise) and its prompt is ``sum_m alpha_m P_m``: every weight is
differentiable, so keys and attention vectors train end to end with the task loss (no surrogate key loss).
:func:`orthogonality` is the paper's penalty ``mean((B B^T - I)^2)`` on keys, attention vectors and flattened
components. The three start with orthonormal rows (as the code's Gram-Schmidt initialisation gives)."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


def orthonormal_rows(rows: int, width: int) -> torch.Tensor:
    """``(rows, width)`` with orthonormal rows (while ``rows <= width``; else as many as fit, the rest random)."""
    q, _ = torch.linalg.qr(torch.randn(width, rows))
    return q.T.contiguous()


class ComponentPrompt(nn.Module):
    def __init__(self, pool: int, length: int, width: int) -> None:
        super().__init__()
        self.length = length
        self.prompts = nn.Parameter(orthonormal_rows(pool, length * width).view(pool, length, width))
        self.keys = nn.Parameter(orthonormal_rows(pool, width))
        self.attention = nn.Parameter(orthonormal_rows(pool, width))

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        """The prompt of each query ``(N, D)``: ``(N, length, D)``."""
        return torch.einsum("nm,mld->nld", component_weights(query, self.keys, self.attention), self.prompts)


def component_weights(query: torch.Tensor, keys: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """``alpha[n, m] = cos(query_n * attention_m, keys_m)``: ``(N, M)``."""
    attended = F.normalize(query.unsqueeze(1) * attention.unsqueeze(0), dim=-1, eps=1e-12)  # (N, M, D)
    return torch.einsum("nmd,md->nm", attended, F.normalize(keys, dim=-1, eps=1e-12))


def orthogonality(rows: torch.Tensor) -> torch.Tensor:
    """CODA-P's penalty on a ``(M, ...)`` tensor, flattened to ``B`` of M rows: ``mean((B B^T - I)^2)``."""
    b = rows.reshape(rows.shape[0], -1)
    return ((b @ b.T - torch.eye(b.shape[0], dtype=b.dtype, device=b.device)) ** 2).mean()
