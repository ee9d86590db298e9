"""FedCurv (Shoham et al. 2019, arXiv 1910.07796): an EWC-style penalty towards the other clients' results.

Client ``s`` minimises ``L_s(w) + lambda * sum_{j != s} (w - w_j)^T diag(I_j) (w - w_j)`` (eq. 3) over the
clients ``j`` of the previous round, with ``w_j`` their trained weights and ``I_j`` their diagonal Fisher at
``w_j`` on their local data. In the communication-efficient form (Sec. 3.1) the server keeps
``u = sum_j I_j`` and ``v = sum_j I_j w_j`` and broadcasts both; the client subtracts its own last
contribution if it was among them and uses ``lambda * sum (u' w^2 - 2 w v')``, the penalty up to a
constant (same gradient). Traffic: ``w``, ``I``, ``I w`` up and ``w``, ``u``, ``v`` down (3x the model each
way) plus the round index, so a client knows whether ``u``, ``v`` hold its contribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cfl.methods.base import ClientData, Method, MethodState, Params, State
from cfl.methods.client_state import client_state_bytes
from cfl.ops.fisher import diagonal_fisher
from cfl.schema import field


@dataclass(frozen=True)
class FedCurvParams:
    lam: float = field(1.0, "lambda: weight of sum_{j != s} (w - w_j)^T diag(I_j) (w - w_j)", min=0.0)
    fisher: str = field("empirical", "empirical: squared gradients of log p(true label); true: expectation "
                        "over the model's predictive distribution", choices=("empirical", "true"))


class FedCurv(Method):
    name = "fedcurv"
    about = "FedCurv: Fisher-weighted penalty towards the previous round's other clients (u, v broadcast)"
    Params = FedCurvParams
    has_penalty = True

    def __init__(self, params: Any, run: Any) -> None:
        super().__init__(params, run)
        self._round = 0  # index of the current round, read from the broadcast; stamps the client's contribution

    # ---- server ----
    def broadcast(self, server: State) -> State:
        self._round = int(server.get("round", 0))
        if "u" not in server:
            return {}
        stamp = torch.tensor(self._round, dtype=torch.int32, device=next(iter(server["u"].values())).device)
        return {"u": server["u"], "v": server["v"], "round": stamp}

    def round_end(self, payloads: dict[int, State], server: State) -> None:
        server["round"] = int(server.get("round", 0)) + 1
        if not payloads:
            server.pop("u", None)
            server.pop("v", None)
            return
        contributions = list(payloads.values())
        server["u"] = {k: sum(c["I"][k] for c in contributions) for k in contributions[0]["I"]}
        server["v"] = {k: sum(c["Iw"][k] for c in contributions) for k in contributions[0]["Iw"]}

    # ---- client ----
    def round_payload(self, model: nn.Module, params: Params, data: ClientData, state: State) -> State:
        """Diagonal Fisher at the client's trained weights on its local data; kept in its state as well."""
        fisher = diagonal_fisher(model, params, data.x, data.y, data.task, self.p.fisher,
                                 batch_size=self.run.batch_size)
        weighted = {k: fisher[k] * params[k].detach() for k in fisher}
        for k in fisher:
            state[f"I.{k}"], state[f"Iw.{k}"] = fisher[k], weighted[k]
        state["round"] = torch.tensor(self._round, dtype=torch.int32, device=data.y.device)
        return {"I": fisher, "Iw": weighted}

    def stack_states(self, states: list[State]) -> State:
        """Stack the clients' last contributions; clients without one get zeros and round -1."""
        template = next((s for s in states if "round" in s), None)
        if template is None:
            return {}
        blank = {k: torch.full_like(v, -1) if k == "round" else torch.zeros_like(v) for k, v in template.items()}
        return {k: torch.stack([(s if "round" in s else blank)[k] for s in states]) for k in template}

    def penalty(self, params: Params, global_params: Params, broadcast: State, state: State) -> torch.Tensor:
        first = next(iter(params.values()))
        total = torch.zeros((), device=first.device, dtype=first.dtype)
        for k, (u, v) in self._others(params, broadcast, state).items():
            w = params[k]
            total = total + (u * w * w - 2.0 * w * v).sum()
        return self.p.lam * total

    def penalty_gradient(self, global_params: Params, broadcast: State,
                         state: State) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``2 lambda (u w - v)``, with ``u``, ``v`` the other clients' sums."""
        return {k: (2.0 * self.p.lam * u, 2.0 * self.p.lam * v)
                for k, (u, v) in self._others(global_params, broadcast, state).items()}

    def _others(self, params: Params, broadcast: State, state: State) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per parameter, ``u = sum I_j`` and ``v = sum I_j w_j`` over the other clients (empty before the first
        broadcast): the server's sums less this client's own last contribution, if they contain it."""
        if "u" not in broadcast:
            return {}
        first = next(iter(params.values()))
        # 1 if this client's last contribution is inside u, v (it took part in the previous round)
        mine = (state["round"] == broadcast["round"] - 1).to(first.dtype) if "round" in state else None
        out = {}
        for k in params:
            u, v = broadcast["u"][k], broadcast["v"][k]
            if mine is not None:
                u, v = u - mine * state[f"I.{k}"], v - mine * state[f"Iw.{k}"]
            out[k] = (u, v)
        return out

    def stats(self, state: MethodState) -> dict[str, Any]:
        return {"fisher": self.p.fisher, **client_state_bytes(state)}
