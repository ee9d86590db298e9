"""FedWeIT's decomposed layer weight (Yoon et al., "Federated Continual Learning with Weighted Inter-client
Transfer", ICML 2021, eq. 2), for one layer of one client:

    theta_c^(t) = B_c * m_c^(t) + A_c^(t) + sum_{i,j} alpha_{i,j}^(t) A_i^(j)

``B`` the base (the only part the server averages), ``m`` a per-task mask over the layer's OUTPUT units (the
official code, ``wyjeong/FedWeIT`` ``modules/nets.py``, makes it a vector of the kernel's last, output, dim and
gates it with a sigmoid), ``A`` the sparse task-adaptive part, and an attention-weighted sum of the knowledge
base: task-adaptive parts of clients from the server.

Layout: torch's, output dim first: a linear weight ``(out, in)``, a conv weight ``(out, in, kh, kw)``; ``mask``
``(out,)`` (or ``(..., out)`` with the same leading dims as ``base``'s extra ones); the knowledge base ``kb``
``(K, out, ...)`` with ``attention`` ``(K,)``. Pure tensor functions, no branch on data.
"""

from __future__ import annotations

import torch


def gate(mask_logits: torch.Tensor) -> torch.Tensor:
    """The mask ``m`` the weight uses: the sigmoid of the trained logits (the official code's ``generate_mask``)."""
    return torch.sigmoid(mask_logits)


def per_unit(mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``mask`` ``(..., out)`` viewed to broadcast over ``weight`` ``(..., out, *rest)`` along its output dim."""
    return mask.reshape(*mask.shape, *([1] * (weight.dim() - mask.dim())))


def knowledge_sum(kb: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """``sum_k attention[..., k] * kb[k]``: ``kb`` ``(K, out, ...)``, ``attention`` ``(..., K)`` gives
    ``(..., out, ...)`` (one sum per leading index of ``attention``, e.g. one per task)."""
    return torch.tensordot(attention, kb, dims=([attention.dim() - 1], [0]))


def decomposed_weight(base: torch.Tensor, mask: torch.Tensor, adaptive: torch.Tensor,
                      kb: torch.Tensor | None = None, attention: torch.Tensor | None = None) -> torch.Tensor:
    """``base * mask + adaptive + sum_k attention_k kb_k`` with ``mask`` the gated mask (see :func:`gate`), one
    value per output unit. ``base`` ``(out, ...)``; ``adaptive`` ``(..., out, ...)`` (leading dims: e.g. one per
    task, then ``mask`` ``(..., out)`` and ``attention`` ``(..., K)`` carry them too)."""
    theta = base * per_unit(mask, adaptive) + adaptive
    if kb is not None:
        if attention is None:
            raise ValueError("decomposed_weight: a knowledge base needs its attention weights")
        theta = theta + knowledge_sum(kb, attention)
    return theta


def hard_threshold(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """``x`` where ``|x| > threshold``, else 0: the official code's ``l1_pruning`` (applied to ``A`` with the L1
    weight as the threshold at evaluation and before ``A`` goes to the knowledge base)."""
    return x * (x.abs() > threshold).to(x.dtype)


def fold_knowledge(kb_mix: torch.Tensor, attention: torch.Tensor, kb: torch.Tensor,
                   task: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At the end of ``task``: ``kb_mix`` ``(T, out, ...)`` with ``attention[task] . kb`` added to its row
    ``task``, and ``attention`` ``(T, K)`` with that row 0 (new tensors): the task's composed weight stays the
    same once ``kb`` is replaced by the next task's knowledge base (cfl's storage; the official code keeps every
    task's knowledge base)."""
    kb_mix, attention = kb_mix.clone(), attention.clone()
    kb_mix[task] += knowledge_sum(kb, attention[task])
    attention[task] = 0
    return kb_mix, attention
