"""Powder's task-correlated prompt components (Piao et al., ICML 2024, "Federated Continual Learning via
Prompt-based Dual Knowledge Transfer"; official code github.com/piaohongming/Powder, ``CodaPrompt_2d_v2`` in
``src/models_Cprompt/vit_coda_p.py``, read at commit ae7beeb): every task ``t`` owns ``C`` CODA-P components per
prompted block (``keys``, ``attention`` ``(T, L, C, D)``, ``prompts`` ``(T, L, C, length, D)``). An input of task
``g`` composes, for each task ``i`` that ``selection[g]`` marks (the server's top-k of the task correlation,
cfl/methods/powder.py), the components ``sum_j mixing[i, j] X_j`` (X: keys, attention, prompts; ``mixing`` the
row-normalised task correlation ``W``), scores each composed component by ``cos(q * A, K)`` of its query (no
softmax) and prepends ``sum (score * P) / k`` to the tokens before block ``l`` (prompt tuning: the code's ``v2``
path; the tokens accumulate, so the [CLS] token ends ``L * length`` places on).

``mixing`` and ``selection`` are parameters that no step moves (the method zeroes their gradient) and that the
server sets: they travel with the model, so evaluation composes each task's prompt as training does. They start
as the identity (each task its own components only). Every component row starts orthonormal (per block, the
``T * C`` keys, attention vectors and flattened prompts at once, in sets of the width where they outnumber it; the
code draws a stage's new rows by Gram-Schmidt against the trained ones at the stage's start)."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from cfl.pretrained.coda_prompt import orthonormal_rows


class TaskComponents(nn.Module):
    def __init__(self, tasks: int, components: int, length: int, width: int, blocks: int) -> None:
        super().__init__()
        self.tasks, self.components, self.length, self.blocks = tasks, components, length, blocks

        def drawn(size: int) -> torch.Tensor:
            rows = torch.stack([orthonormal_draw(tasks * components, size) for _ in range(blocks)])  # (L, T C, size)
            return rows.view(blocks, tasks, components, size).transpose(0, 1).contiguous()

        self.keys = nn.Parameter(drawn(width))
        self.attention = nn.Parameter(drawn(width))
        self.prompts = nn.Parameter(drawn(length * width).view(tasks, blocks, components, length, width))
        self.mixing = nn.Parameter(torch.eye(tasks))
        self.selection = nn.Parameter(torch.eye(tasks))

    def composed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each task's composed keys, attention vectors ``(T, L, C, D)`` and prompts ``(T, L, C, length, D)``."""
        m = self.mixing
        return (torch.einsum("ij,jlcd->ilcd", m, self.keys), torch.einsum("ij,jlcd->ilcd", m, self.attention),
                torch.einsum("ij,jlcpd->ilcpd", m, self.prompts))

    def scores(self, query: torch.Tensor) -> torch.Tensor:
        """``cos(q * A, K)`` of every task's composed components: ``(N, L, T, C)``."""
        keys, attention, _ = self.composed()
        return component_scores(query, keys, attention)

    def forward(self, query: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        """The prompt of each input ``(N, L, length, D)``: its task's selected tasks' composed components,
        weighted by their scores and divided by the number selected."""
        keys, attention, prompts = self.composed()
        scores = component_scores(query, keys, attention)  # (N, L, T, C)
        chosen = self.selection[task]  # (N, T), 0/1
        chosen = chosen / chosen.sum(1, keepdim=True)
        return torch.einsum("nltc,nt,tlcpd->nlpd", scores, chosen, prompts)


def orthonormal_draw(rows: int, width: int) -> torch.Tensor:
    """``(rows, width)``: orthonormal rows while ``rows <= width``; more rows than the width holds come in
    consecutive orthonormal sets of ``width`` (the official Gram-Schmidt would run out of directions there)."""
    sets = [orthonormal_rows(min(width, rows - start), width) for start in range(0, rows, width)]
    return torch.cat(sets)


def component_scores(query: torch.Tensor, keys: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """``cos(q_n * A[t, l, c], K[t, l, c])`` ``(N, L, T, C)`` of queries ``(N, D)`` and ``(T, L, C, D)`` tensors."""
    attended = F.normalize(query[:, None, None, None] * attention.unsqueeze(0), dim=-1, eps=1e-12)  # (N, T, L, C, D)
    cos = torch.einsum("ntlcd,tlcd->ntlc", attended, F.normalize(keys, dim=-1, eps=1e-12))
    return cos.transpose(1, 2)
