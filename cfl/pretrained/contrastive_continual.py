"""Fed-CPrompt's two client-side pieces (Bagwe, Yuan, Pan, Zhang, 2023, "Fed-CPrompt: Contrastive Prompt for
Rehearsal-Free Federated Continual Learning", arXiv 2307.04869; official code github.com/grbagwe/Fed-CPrompt,
``learners/prompt.py`` and ``models/vit_coda_p.py``, read through the fetch tool):

* :func:`contrastive_continual_loss`, the contrastive continual loss (C2L): a triplet loss on the head's input
  features, the client's current model the anchor, the round's global model the positive (pulled towards: the
  clients' local prompts agree) and the previous task's global model the negative (pushed away from: the new task's
  prompts differ from the old ones); on a client's first task there is no negative and only the pull remains;
* :func:`task_rows`, the task-specific prompt components: the ``pool`` components are split into one slice per task
  (CODA-P's ``pool / tasks`` per task), and at a task only its own slice learns (earlier slices are frozen).
"""

from __future__ import annotations

import torch


def contrastive_continual_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor | None,
                               margin: float, pull: float, push: float) -> torch.Tensor:
    """C2L per sample ``(B,)`` of features ``(B, D)``:
    ``max(0, pull * |anchor - positive|^2 - push * |anchor - negative|^2 + margin)``; without a negative (a client's
    first task) ``pull * |anchor - positive|^2``. ``pull`` and ``push`` are the official code's scales of the two
    squared distances (1e3 and 1e1), ``margin`` its triplet margin (1)."""
    near = pull * (anchor - positive).pow(2).sum(-1)
    if negative is None:
        return near
    return torch.relu(near - push * (anchor - negative).pow(2).sum(-1) + margin)


def batch_contrastive_continual_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor | None,
                                     margin: float, pull: float, push: float, weight: torch.Tensor) -> torch.Tensor:
    """C2L as the official ``TripletLoss`` reduces it: one hinge of the batch sum,
    ``max(0, sum_b w_b (pull |a_b - p_b|^2 - push |a_b - n_b|^2) + margin)`` (``weight`` ``(B,)``: 1 for a real
    sample, 0 for padding); without a negative the official ``positive_loss``, ``sum_b w_b pull |a_b - p_b|^2``.
    A scalar."""
    near = pull * (anchor - positive).pow(2).sum(-1)
    if negative is None:
        return (weight * near).sum()
    return torch.relu((weight * (near - push * (anchor - negative).pow(2).sum(-1))).sum() + margin)


def task_rows(pool: int, num_tasks: int) -> torch.Tensor:
    """The task that owns each of ``pool`` components ``(pool,)`` long: task ``t`` owns rows
    ``t * pool // num_tasks`` to ``(t + 1) * pool // num_tasks`` (every row owned, slices differing by one at most)."""
    if pool < num_tasks:
        raise ValueError(f"{pool} prompt components cannot give each of {num_tasks} tasks its own")
    starts = [t * pool // num_tasks for t in range(num_tasks + 1)]
    owner = torch.empty(pool, dtype=torch.long)
    for t in range(num_tasks):
        owner[starts[t]:starts[t + 1]] = t
    return owner
