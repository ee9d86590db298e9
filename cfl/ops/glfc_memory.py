"""GLFC's exemplar memory on a client: iCaRL herding (Rebuffi et al., CVPR 2017, Algorithm 4) with a per-client
budget, as the official GLFC code keeps it (``conditionWang/FCIL``, ``src/GLFC.py``).

The budget ``memory_size`` is shared equally by the classes the client has learned: ``memory_size // learned``
exemplars per class; when classes are added the older sets keep their first exemplars (herding orders them by
importance), and each new class's set is chosen by herding on the L2-normalised features of the current global
model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def herding(features: torch.Tensor, m: int, repeats: bool = False) -> torch.Tensor:
    """Indices ``(min(m, n),)`` of ``m`` exemplars of one class, in order of choice: step ``i`` (1-based) takes the
    sample whose feature brings the mean of the chosen ones closest to the class mean,
    ``argmin_j || mu - (sum of chosen + f_j) / i ||``, features L2-normalised, ``mu`` their mean; ties go to the
    lowest index.

    ``repeats``: the official code's quirk (off by default): every sample stays a candidate, so one may be chosen
    twice, and ``m`` indices come back even when the class has fewer samples."""
    if m < 0:
        raise ValueError(f"herding: m={m} exemplars; m must be >= 0")
    f = F.normalize(features.reshape(len(features), -1).to(torch.float64), dim=1)
    mu = f.mean(0)
    squares = (f * f).sum(1)
    chosen_sum = torch.zeros_like(mu)
    free = torch.ones(len(f), dtype=torch.bool, device=f.device)
    picks: list[int] = []
    for i in range(1, (m if repeats else min(m, len(f))) + 1):
        # || t - f_j / i ||^2 with t = mu - chosen_sum / i, less the |t|^2 every j shares: one product with f per
        # step instead of three passes over it (the class's samples are many, e.g. 6000 for 2000 exemplars)
        dist = squares / (i * i) - (2.0 / i) * (f @ (mu - chosen_sum / i))
        if not repeats:
            dist = dist.masked_fill(~free, float("inf"))
        j = int(torch.argmin(dist))
        picks.append(j)
        chosen_sum += f[j]
        free[j] = False
    return torch.tensor(picks, dtype=torch.long, device=features.device)


def per_class_quota(memory_size: int, learned_classes: int) -> int:
    """Exemplars kept per class: ``memory_size // learned_classes`` (the official code's ``m``)."""
    if learned_classes < 1:
        raise ValueError(f"per_class_quota: {learned_classes} learned classes; a memory holds at least one class")
    return memory_size // learned_classes


def refill(sets: dict[int, torch.Tensor], new_features: dict[int, torch.Tensor], memory_size: int,
           repeats: bool = False) -> dict[int, torch.Tensor]:
    """The memory after learning the classes of ``new_features`` (class -> features of its samples): every class's
    quota is ``memory_size // (old classes + new classes)``; each old set (class -> rows in herding order) keeps
    its first rows, each new one gets the rows :func:`herding` chooses (rows into that class's samples)."""
    clash = sorted(set(sets) & set(new_features))
    if clash:
        raise ValueError(f"refill: classes {clash} are in the memory already; herd a class once")
    m = per_class_quota(memory_size, len(sets) + len(new_features))
    out = {c: rows[:m] for c, rows in sets.items()}
    out.update({c: herding(f, m, repeats) for c, f in new_features.items()})
    return out
