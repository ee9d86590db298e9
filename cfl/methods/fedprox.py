"""FedProx (Li et al., MLSys 2020): local loss adds ``mu/2 * ||w - w_global||^2``."""

from __future__ import annotations

from dataclasses import dataclass

from cfl.methods.base import Method, Quadratic
from cfl.methods.bounds import WEIGHT_MAX
from cfl.schema import field
from cfl.tensors import Params, State


@dataclass(frozen=True)
class FedProxHyperparams:
    mu: float = field(0.01, "weight of the proximal term", min=0.0, max=WEIGHT_MAX)


class FedProx(Method):
    name = "fedprox"
    about = "FedProx: proximal term mu/2 ||w - w_global||^2 in the local loss"
    Hyperparams = FedProxHyperparams

    def penalty(self, global_params: Params, server: State, state: State) -> dict[str, Quadratic]:
        return {k: Quadratic(self.hparams.mu, w) for k, w in global_params.items()}
