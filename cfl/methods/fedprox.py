"""FedProx (Li et al., MLSys 2020): local loss adds ``mu/2 * ||w - w_global||^2``."""

from __future__ import annotations

from dataclasses import dataclass

from cfl.config.schema import field
from cfl.methods.base import ClientRound, Computes, Method, Quadratic, RoundTerms
from cfl.methods.bounds import WEIGHT_MAX


@dataclass(frozen=True)
class FedProxHyperparams:
    mu: float = field(0.01, "weight of the proximal term", min=0.0, max=WEIGHT_MAX)


class FedProx(Method):
    name = "fedprox"
    about = "FedProx: proximal term mu/2 ||w - w_global||^2 in the local loss"
    computes = Computes(terms=("penalty",))
    Hyperparams = FedProxHyperparams

    def round_terms(self, ctx: ClientRound) -> RoundTerms:
        return RoundTerms({k: Quadratic(self.hparams.mu, w) for k, w in ctx.global_params.items()})
