"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, arXiv 2111.04263).

Client ``k`` minimises ``L_k(w) - <h_k, w> + alpha/2 ||w - w^{t-1}||^2``, with ``h_k`` (its last gradient, 0 at
first) as the linear coefficient of a :class:`Quadratic` (fused on the stacked path). After training to ``w_k``:
``h_k <- h_k - alpha (w_k - w^{t-1})``. The server keeps ``h <- h - alpha/N sum_k (w_k - w^{t-1})`` over the
round's clients and sets ``w^t = mean_k w_k - h / alpha``. cfl's reading: ``mean_k`` is the run's aggregator
(weighted by samples under ``aggregator: mean``, the paper's plain mean for equal clients), and ``h``'s sum is
``|P_t|`` times that mean."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, ClientRound, Method, Payload, Quadratic, RoundTerms
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.declarations import Computes, Requires, Sends
from cfl.methods.server_hooks import ServerEvent, ServerUpdate
from cfl.tensors import Params


@dataclass(frozen=True)
class FedDynHyperparams:
    alpha: float = field(0.01, "weight alpha of the dynamic regulariser (the paper: 0.1, 0.01, 0.001)", gt=0.0,
                         max=WEIGHT_MAX)


class FedDyn(Method):
    name = "feddyn"
    about = "FedDyn: a dynamic linear + quadratic regulariser per client, the server corrects by h/alpha"
    Hyperparams = FedDynHyperparams
    sends = Sends(server_events=("start",), client_events=("round",))
    requires = Requires(unread_keys={"server_lr": "FedDyn's server sets w = mean(w_k) - h/alpha itself"})
    computes = Computes(terms=("penalty",))

    def server_event(self, ctx: ServerEvent) -> None:
        ctx.server["h"] = {k: torch.zeros_like(v) for k, v in ctx.global_params.items()}

    def round_terms(self, ctx: ClientRound) -> RoundTerms:
        h, alpha = ctx.state.get("h", {}), self.hparams.alpha
        return RoundTerms({k: Quadratic(alpha, w, -h[k] if k in h else None) for k, w in ctx.global_params.items()})

    def client_end(self, ctx: ClientEndContext) -> None:
        h, g = ctx.state.get("h", {}), ctx.training.global_params
        ctx.state["h"] = {k: (h[k] if k in h else 0.0) - self.hparams.alpha * (v - g[k]) for k, v in ctx.params.items()}

    def server_update(self, ctx: ServerUpdate) -> Params:
        alpha, share = self.hparams.alpha, self.run_info.clients_per_round / self.run_info.num_clients
        ctx.server["h"] = {k: h - alpha * share * ctx.delta[k] for k, h in ctx.server["h"].items()}
        return {k: w + ctx.delta[k] - ctx.server["h"][k] / alpha for k, w in ctx.global_params.items()}

    def count_bytes(self, ctx: Payload) -> int | None:
        """The clients' state: each client that has trained keeps ``h_k``, a model's worth."""
        return None if (s := ctx.sizing) is None else min(s.num_clients, s.rounds * s.clients_per_round) * s.model_bytes
