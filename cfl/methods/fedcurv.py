"""FedCurv (Shoham et al. 2019, arXiv 1910.07796): an EWC-style penalty towards the other clients' results.

Client ``s`` minimises ``L_s(w) + lambda * sum_{j != s} (w - w_j)^T diag(I_j) (w - w_j)`` (eq. 3) over the
clients ``j`` of the previous round, with ``w_j`` their trained weights and ``I_j`` their diagonal Fisher at
``w_j`` on their local data. In the communication-efficient form (Sec. 3.1) the server keeps
``u = sum_j I_j`` and ``v = sum_j I_j w_j`` and broadcasts both; the client subtracts its own last
contribution if it was among them and uses ``lambda * sum u' (w - v'/u')^2``, the penalty up to a
constant (same gradient ``2 lambda (u' w - v')``). Traffic: ``w``, ``I``, ``I w`` up and ``w``, ``u``, ``v``
down (3x the model each way) plus the round index, so a client knows whether ``u``, ``v`` hold its contribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, ClientRound, Method, Payload, Quadratic, RoundTerms, ServerEvent
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.declarations import Computes, Sends
from cfl.ops.fisher import diagonal_fisher
from cfl.tensors import State


@dataclass(frozen=True)
class FedCurvHyperparams:
    lam: float = field(1.0, "lambda: weight of sum_{j != s} (w - w_j)^T diag(I_j) (w - w_j)", min=0.0, max=WEIGHT_MAX)
    fisher: str = field("empirical", "empirical: squared gradients of log p(true label); true: expectation "
                        "over the model's predictive distribution", choices=("empirical", "true"))


class FedCurv(Method):
    name = "fedcurv"
    about = "FedCurv: Fisher-weighted penalty towards the previous round's other clients (u, v broadcast)"
    Hyperparams = FedCurvHyperparams
    # nothing at task ends
    sends = Sends(server_events=("round",), broadcast={"round": ("u", "v", "round")}, client_events=("round",))
    computes = Computes(terms=("penalty",))

    # ---- server ----
    def server_event(self, ctx: ServerEvent) -> None:
        server, uploads = ctx.server, ctx.uploads
        server["round"] = torch.tensor(int(server.get("round", 0)) + 1, dtype=torch.int32)
        if not uploads:
            server.pop("u", None)
            server.pop("v", None)
            return
        contributions = list(uploads.values())
        server["u"] = {k: sum(c["I"][k] for c in contributions) for k in contributions[0]["I"]}
        server["v"] = {k: sum(c["Iw"][k] for c in contributions) for k in contributions[0]["Iw"]}
        server["round"] = server["round"].to(next(iter(server["u"].values())).device)

    def count_bytes(self, ctx: Payload) -> int | None:
        """A client that trained keeps its last Fisher ``I`` and ``I * w`` (two model-sized tensors) and a stamp."""
        return None if (s := ctx.sizing) is None else min(s.num_clients, s.rounds * s.clients_per_round) * (
            2 * s.model_bytes + 4)

    def client_end(self, ctx: ClientEndContext) -> State | None:
        """Diagonal Fisher at the client's trained weights on its local data; kept in its state as well,
        stamped with the round it enters the server's sums."""
        model, params, data, state, server = ctx.model, ctx.params, ctx.data, ctx.state, ctx.server
        fisher = diagonal_fisher(model, params, data.x, data.y, data.task, self.hparams.fisher,
                                 batch_size=self.run_info.batch_size)
        weighted = {k: fisher[k] * params[k].detach() for k in fisher}
        stamp = int(server["round"]) if "round" in server else 0
        state.update(I=fisher, Iw=weighted, round=torch.tensor(stamp, dtype=torch.int32, device=data.y.device))
        return {"I": fisher, "Iw": weighted}

    def round_terms(self, ctx: ClientRound) -> RoundTerms | None:
        """``lambda * u' (w - v'/u')^2`` with ``u'``, ``v'`` the other clients' sums: the server's less this
        client's last contribution if they contain it (it took part in the previous round)."""
        if "u" not in (server := ctx.server):
            return None
        lam, out, state = self.hparams.lam, {}, ctx.state
        mine = (state["round"] == server["round"] - 1) if "round" in state else None
        for k in ctx.global_params:
            u, v = server["u"][k], server["v"][k]
            if mine is not None:
                u, v = u - mine.to(u.dtype) * state["I"][k], v - mine.to(v.dtype) * state["Iw"][k]
            anchor = v / u
            kept = torch.isfinite(anchor)  # u' = 0: no penalty on that entry
            out[k] = Quadratic(torch.where(kept, 2.0 * lam * u, 0.0), torch.where(kept, anchor, 0.0))
        return RoundTerms(out)
