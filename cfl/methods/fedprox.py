"""FedProx (Li et al., MLSys 2020): local loss adds ``mu/2 * ||w - w_global||^2``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.methods.base import Method, Params, State
from cfl.schema import field


@dataclass(frozen=True)
class FedProxParams:
    mu: float = field(0.01, "weight of the proximal term", min=0.0)


class FedProx(Method):
    name = "fedprox"
    about = "FedProx: proximal term mu/2 ||w - w_global||^2 in the local loss"
    Params = FedProxParams
    has_penalty = True

    def penalty(self, params: Params, global_params: Params, broadcast: State, state: State) -> torch.Tensor:
        total = sum(((params[k] - global_params[k]) ** 2).sum() for k in params)
        return 0.5 * self.p.mu * total

    def penalty_gradient(self, global_params: Params, broadcast: State,
                         state: State) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``mu * (w - w_global)``."""
        return {k: (torch.full((), self.p.mu, dtype=w.dtype, device=w.device), self.p.mu * w)
                for k, w in global_params.items()}
