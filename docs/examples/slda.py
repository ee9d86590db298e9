"""Federated streaming LDA on a frozen backbone's cached features, as a cfl plugin (after Hayes & Kanan, "Lifelong
Machine Learning with Deep Streaming Linear Discriminant Analysis", CVPR Workshops 2020, arXiv 1909.01520).

SLDA keeps the class means ``mu_k`` and one covariance ``S`` shared by all classes; its classifier is
``w_k = L mu_k``, ``b_k = -mu_k^T L mu_k / 2`` with ``L = ((1 - eps) S + eps I)^-1`` (the paper's shrinkage
``eps = 1e-4``). Federated here: each client sends, once per task, its per-class sums and counts and its
scatter ``X^T X`` in float64; the server sums them and solves, which equals LDA on the union of every client's
data of the tasks seen (the covariance about the class means, ``(X^T X - sum_k n_k mu_k mu_k^T) / N``).

Run it with (the backbone random here: the mechanics only; give a weights file for a result):
  cfl run configs/quickstart.yaml --plugin docs/examples/slda.py --set method.name=slda \
      --set stream.name=split-digits --set stream.scenario=class \
      --set model.name=vit-ti16 --set model.weights=random --set model.image_size=32 --set model.train=head
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.plugin import ClosedFormHead, State, field, register


@dataclass(frozen=True)
class SLDAHyperparams:
    shrinkage: float = field(1e-4, "eps of ((1 - eps) S + eps I), the paper's 1e-4", gt=0.0, max=1.0)


@register
class SLDA(ClosedFormHead):
    name = "slda"
    about = "Federated SLDA: class means and a shared covariance of frozen features, in closed form (example plugin)"
    Hyperparams = SLDAHyperparams

    def statistics(self, x: torch.Tensor, onehot: torch.Tensor) -> State:
        return {"sums": onehot.T @ x, "counts": onehot.sum(0), "scatter": x.T @ x}

    def solve(self, server: State, slot: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        counts = server["counts"][slot]
        if not bool((counts > 0).any()):
            return None  # no statistics for this head yet
        means = server["sums"][slot] / counts.clamp(min=1).unsqueeze(1)  # (K, D); classes not seen: zero rows
        covariance = (server["scatter"][slot] - means.T @ (counts.unsqueeze(1) * means)) / counts.sum()
        eps = self.hparams.shrinkage
        shrunk = (1 - eps) * covariance + eps * torch.eye(len(covariance), dtype=covariance.dtype)
        weight = torch.linalg.solve(shrunk, means.T).T  # (K, D): L mu_k, L symmetric
        return weight, -0.5 * (weight * means).sum(1)
