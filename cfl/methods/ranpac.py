"""RanPAC (McDonnell et al., "RanPAC: Random Projections and Pre-trained Models for Continual Learning", NeurIPS
2023; official code github.com/RanPAC/RanPAC): a fixed random projection ``h = ReLU(x W_rand)`` of the frozen
features ``x`` (``W_rand``: ``(D, M)``, entries N(0, 1), drawn once), then a ridge regression on ``h``. Each client
sends, once per task, the Gram ``G = h^T h`` ``(M, M)`` and ``C = h^T Y`` ``(M, K)`` of its data (one-hot ``Y``) in
float64; the server sums them over clients and tasks and solves ``W_out = (G + lam I)^-1 C`` in float64; the logits
are ``h W_out``. The result equals the centralised solution on the union of the clients' data of the tasks seen
(tests/methods/test_ranpac.py checks it to 1e-8), whatever the split among clients and the order of the tasks.

``W_rand`` is a function of the run's seed, ``D`` and ``M`` (:func:`random_projection`): every client and the
server regenerate the same matrix, so it is never sent (0 bytes); the method puts it before the model's head
(:meth:`cfl.models.feature_head.FeatureHead.project`), which becomes ``M`` wide. cfl's reading (docs/methods/ranpac.md):
a fixed ``lam`` (the official code picks it per task by a validation split), no intercept (as the official code),
no first-task adapter training (the paper's optional phase 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cfl.config.schema import ConfigError, field
from cfl.methods.afcl import ridge
from cfl.methods.bounds import PROJECTION_MAX, RIDGE_MAX
from cfl.methods.closed_form import ClosedFormHead
from cfl.models.feature_head import FeatureHead
from cfl.tensors import State

#: mixed with the run's seed for W_rand's generator (no other draw of the run shares it)
PURPOSE = 0x52414E50  # "RANP"


@dataclass(frozen=True)
class RanPACHyperparams:
    projection_dim: int = field(2000, "M, the random projection's width (h = ReLU(x W_rand), W_rand D x M of N(0, 1) "
                                "entries from the run's seed); the paper and the official code use 10000, cfl's "
                                "default 2000 keeps each float64 Gram at 32 MB (M^2 x 8 bytes, sent by each client "
                                "once per task) and the server's M x M solve light on a CPU; at most 20000", min=1,
                                max=PROJECTION_MAX)
    lam: float = field(1.0, "ridge lambda of (G + lam I), fixed (the official code picks it per task from "
                       "1e-8..1e8 on a validation split of the task's data); at most 1e8, that search's top", gt=0,
                       max=RIDGE_MAX)


def random_projection(seed: int, features: int, dim: int) -> torch.Tensor:
    """W_rand ``(features, dim)``, float32 entries N(0, 1) from a generator of its own seeded by ``seed`` (the global
    random generator is left alone)."""
    derived = int(np.random.SeedSequence([int(seed), PURPOSE]).generate_state(2, dtype=np.uint64)[0] >> 1)
    return torch.randn(features, dim, generator=torch.Generator().manual_seed(derived))


class RanPAC(ClosedFormHead):
    name = "ranpac"
    about = ("RanPAC: a fixed random projection ReLU(x W_rand) of frozen features, then the server's float64 ridge "
             "regression on the clients' Gram and cross-covariance, sent once per task (McDonnell et al. 2023); a "
             "pretrained backbone's model")
    Hyperparams = RanPACHyperparams

    def __init__(self, hparams: Any, run_info: Any) -> None:
        model = run_info.model
        if not isinstance(model, FeatureHead):
            raise ConfigError(f"method ranpac projects a frozen backbone's cached features: its model is a pretrained "
                              f"backbone's head (model.train: head), not {type(model).__name__}")
        model.project(random_projection(run_info.seed, model.features, hparams.projection_dim))
        super().__init__(hparams, run_info)
        self.w_rand = model.projection

    def statistics(self, x: torch.Tensor, onehot: torch.Tensor) -> State:
        h = torch.relu(x @ self.w_rand.to(device=x.device, dtype=torch.float64))
        return {"gram": h.T @ h, "cross": h.T @ onehot}

    def solve(self, server: State, slot: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        gram = server["gram"][slot]
        if not bool(gram.diagonal().sum() > 0):  # sum of |h|^2 over the samples seen: 0 with none
            return None
        w = ridge(gram, server["cross"][slot], self.hparams.lam)  # (M, K)
        return w.T, w.new_zeros(w.shape[1])
