"""DualPrompt's prompts (Wang et al., ECCV 2022, "DualPrompt: Complementary Prompting for Rehearsal-free Continual
Learning", Sec. 4; official code github.com/google-research/l2p, ``models/prompt.py`` and ``models/vit.py``, and
its PyTorch port github.com/JH-LEE-KR/dualprompt-pytorch): a G-prompt (general, shared by every task) of
``g_length`` prefix tokens in each of the first ``g_layers`` blocks, and a pool of E-prompts (expert) of
``length`` prefix tokens in each of the next ``e_layers`` blocks, one per task, each with a key. At training, an
input of task ``t`` uses E-prompts ``t * top_k ... (t + 1) * top_k - 1`` (the code's ``use_prompt_mask``); at
evaluation the ``top_k`` keys most cosine-similar to the input's query (the frozen backbone's [CLS] feature) pick
them. Prompts and keys start uniform in [-1, 1) (the PyTorch port's ``nn.init.uniform_(-1, 1)``; the JAX code's
flax ``uniform()`` draws in [0, 0.01))."""

from __future__ import annotations

import torch
from torch import nn

from cfl.pretrained.prompt_pool import select


def task_prompts(task: torch.Tensor, top_k: int) -> torch.Tensor:
    """The E-prompts an input of task ``task`` ``(N,)`` trains: ``(N, top_k)``, ``t * top_k + j``."""
    return task.long().unsqueeze(1) * top_k + torch.arange(top_k, device=task.device)


class DualPrompts(nn.Module):
    """``g`` ``(g_layers, 2, g_length, D)``, ``prompts`` ``(pool, e_layers, 2, length, D)`` (key and value
    prefixes per layer) and ``keys`` ``(pool, D)``."""

    def __init__(self, pool: int, length: int, top_k: int, width: int, g_length: int, g_layers: int,
                 e_layers: int) -> None:
        super().__init__()
        if top_k > pool:
            raise ValueError(f"top_k {top_k} is more than the pool's {pool} E-prompts")
        self.top_k, self.g_layers, self.e_layers = top_k, g_layers, e_layers
        self.g = nn.Parameter(torch.empty(g_layers, 2, g_length, width).uniform_(-1, 1))
        self.prompts = nn.Parameter(torch.empty(pool, e_layers, 2, length, width).uniform_(-1, 1))
        self.keys = nn.Parameter(torch.empty(pool, width).uniform_(-1, 1))

    def chosen(self, query: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor:
        """The E-prompt indices ``(N, top_k)``: the task's (``task`` given: training), else the keys' top-k."""
        return task_prompts(task, self.top_k) if task is not None else select(query, self.keys, self.top_k)[0]

    def forward(self, query: torch.Tensor, task: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Per block of the first ``g_layers + e_layers``, the prefix ``(N, 2, L, D)`` of each input."""
        n = query.shape[0]
        chosen = self.chosen(query, task)
        picked = torch.index_select(self.prompts, 0, chosen.reshape(-1))  # (N * top_k, e_layers, 2, length, D)
        picked = picked.view(n, self.top_k, *self.prompts.shape[1:]).permute(0, 2, 3, 1, 4, 5)
        e = picked.reshape(n, self.e_layers, 2, -1, self.prompts.shape[-1])  # the top_k prompts side by side
        general = [self.g[i].unsqueeze(0).expand(n, -1, -1, -1) for i in range(self.g_layers)]
        return [*general, *e.unbind(1)]
