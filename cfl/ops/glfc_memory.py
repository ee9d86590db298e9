"""GLFC's and FediCaRL's exemplar memory on a client: iCaRL herding (Rebuffi et al., CVPR 2017, Algorithm 4) with a
per-client budget, as the official GLFC code keeps it (``conditionWang/FCIL``, ``src/GLFC.py``).

The budget ``memory_size`` is shared equally by the classes the client has learned: ``memory_size // learned``
exemplars per class; when classes are added the older sets keep their first exemplars (herding orders them by
importance), and each new class's set is chosen by herding on the L2-normalised features of the current global
model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from cfl.tensors import State


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


def herd_into(state: State, x: torch.Tensor, y: torch.Tensor, task: int, features: torch.Tensor, memory_size: int,
              ids: Callable[[torch.Tensor, torch.Tensor | int], torch.Tensor] | None = None,
              repeats: bool = False) -> None:
    """``state``'s memory (fixed slots ``x``, ``y``, ``task``, ``valid``, filled ones first) after a client learned
    the samples ``x``, ``y`` of ``task`` (``features`` theirs, ``(n, d)``): :func:`refill` on the classes as ``ids``
    names them (GLFC's global ids; None: the label); the old classes first, in the memory's order."""
    valid = state["valid"] if "valid" in state else None
    mem_x, mem_y, mem_t = (x[:0], y[:0], y[:0]) if valid is None else \
        (state["x"][valid], state["y"][valid], state["task"][valid])
    mem_ids, data_ids = (mem_y, y) if ids is None else (ids(mem_y, mem_t), ids(y, task))
    old = {int(c): torch.nonzero(mem_ids == c).flatten() for c in torch.unique(mem_ids).tolist()}
    new = {int(c): torch.nonzero(data_ids == c).flatten() for c in torch.unique(data_ids).tolist()
           if int(c) not in old}
    sets = refill(old, {c: features[rows] for c, rows in new.items()}, memory_size, repeats)
    kept = [new[c][sets[c]] for c in new]
    kx = torch.cat([mem_x[sets[c]] for c in old] + [x[r] for r in kept])
    ky = torch.cat([mem_y[sets[c]] for c in old] + [y[r] for r in kept])
    kt = torch.cat([mem_t[sets[c]] for c in old] + [torch.full_like(r, task) for r in kept])
    state["x"] = torch.zeros(memory_size, *x.shape[1:], dtype=x.dtype, device=x.device)
    state["y"], state["task"] = (torch.zeros(memory_size, dtype=torch.long, device=x.device) for _ in range(2))
    state["valid"] = torch.zeros(memory_size, dtype=torch.bool, device=x.device)
    n = len(ky)
    state["x"][:n], state["y"][:n], state["task"][:n], state["valid"][:n] = kx, ky, kt, True
