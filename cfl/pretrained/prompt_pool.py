"""L2P's prompt pool (Wang et al., CVPR 2022, "Learning to Prompt for Continual Learning", Sec. 4.2): ``pool``
prompts of ``length`` tokens, each with a key; an input's query (the frozen backbone's [CLS] feature) picks the
``top_k`` keys of highest cosine similarity, and their prompts are prepended to the embedded input. The keys are
trained by the surrogate loss ``sum_k (1 - cos(query, key_k))`` over the selected keys (:func:`key_distance`);
the selection itself is discrete (no gradient reaches the keys through it). Prompts and keys start uniform in
[0, 1), as in the official PyTorch port (github.com/JH-LEE-KR/l2p-pytorch, prompt.py: ``nn.init.uniform_``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class PromptPool(nn.Module):
    def __init__(self, pool: int, length: int, top_k: int, width: int) -> None:
        super().__init__()
        if top_k > pool:
            raise ValueError(f"top_k {top_k} is more than the pool's {pool} prompts")
        self.length, self.top_k = length, top_k
        self.prompts = nn.Parameter(torch.rand(pool, length, width))
        self.keys = nn.Parameter(torch.rand(pool, width))

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        """The selected prompts of each query ``(N, D)``, concatenated: ``(N, top_k * length, D)``."""
        chosen = select(query, self.keys, self.top_k)[0]
        width = self.prompts.shape[-1]
        return torch.index_select(self.prompts, 0, chosen.reshape(-1)).view(query.shape[0], -1, width)


def similarity(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each query ``(N, D)`` to each key ``(M, D)``: ``(N, M)``."""
    return F.normalize(query, dim=-1, eps=1e-12) @ F.normalize(keys, dim=-1, eps=1e-12).T


def select(query: torch.Tensor, keys: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query, the indices ``(N, top_k)`` of the ``top_k`` most similar keys (most similar first) and those
    similarities (differentiable in ``keys``)."""
    sims, chosen = similarity(query, keys).topk(top_k, dim=1)
    return chosen, sims


def key_distance(query: torch.Tensor, keys: torch.Tensor, top_k: int) -> torch.Tensor:
    """L2P's surrogate loss per query ``(N,)``: the sum of ``1 - cos(query, key)`` over its selected keys."""
    return (1 - select(query, keys, top_k)[1]).sum(1)
