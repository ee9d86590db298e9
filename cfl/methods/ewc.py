"""EWC+FL: Elastic Weight Consolidation (Kirkpatrick et al., PNAS 2017, arXiv 1612.00796) on each client.

At the end of task ``t`` every client computes the diagonal Fisher ``F_t`` of that task on its local data
at the global model ``w*_t`` (the anchor). Later local training adds

    separate: lambda/2 * sum_{t seen} sum_i F_t,i (w_i - w*_t,i)^2
    online:   lambda/2 * sum_i F*_i (w_i - w*_i)^2,  F* <- gamma F* + F_t,  w* <- w*_t  (Schwarz et al. 2018)

Storage is two model-sized tensors per client in both modes: a sum of quadratics is one quadratic, so
``separate`` keeps ``A = sum_t F_t``, the Fisher-weighted centre ``m = sum_t F_t w*_t / A`` and the constant
``c = sum_t sum_i F_t,i (w*_t,i - m_i)^2``, and ``sum_t F_t (w - w*_t)^2 = A (w - m)^2 + c`` exactly (same
value, same gradient ``lambda * sum_t F_t (w - w*_t)``) with shapes that do not grow with the tasks.
Nothing extra is communicated.
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
class EWCParams:
    lam: float = field(10.0, "lambda: weight of the EWC penalty lambda/2 * sum F (w - w*)^2", min=0.0)
    mode: str = field("separate", "one penalty term per finished task, or one online-consolidated term",
                      choices=("separate", "online"))
    gamma: float = field(1.0, "online mode: decay of the consolidated Fisher, F <- gamma F + F_new",
                         min=0.0, max=1.0)
    fisher: str = field("empirical", "empirical: squared gradients of log p(true label); true: expectation "
                        "over the model's predictive distribution", choices=("empirical", "true"))
    fisher_samples: int | None = field(None, "use at most this many local samples (a seeded random subset) "
                                       "for the Fisher; null: all", min=1)


class EWC(Method):
    name = "ewc"
    about = "EWC+FL: per-client diagonal-Fisher penalty lambda/2 sum F (w - w*)^2 on finished tasks"
    Params = EWCParams
    has_penalty = True
    task_end_participants = "all"

    def penalty(self, params: Params, global_params: Params, broadcast: State, state: State) -> torch.Tensor:
        if "offset" not in state:  # no finished task yet
            return torch.zeros((), device=next(iter(params.values())).device)
        total = state["offset"]
        for k, w in params.items():
            total = total + (state[f"fisher.{k}"] * (w - state[f"anchor.{k}"]) ** 2).sum()
        return 0.5 * self.p.lam * total

    def penalty_gradient(self, global_params: Params, broadcast: State,
                         state: State) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``lambda * F * (w - w*)``; none before the first finished task."""
        if "offset" not in state:
            return {}
        scaled = {k: self.p.lam * state[f"fisher.{k}"] for k in global_params}
        return {k: (a, a * state[f"anchor.{k}"]) for k, a in scaled.items()}

    def task_end_client(self, model: nn.Module, params: Params, data: ClientData, state: State,
                        broadcast: State, generator: torch.Generator) -> None:
        x, y = data.x, data.y
        if self.p.fisher_samples is not None and len(y) > self.p.fisher_samples:
            keep = torch.randperm(len(y), generator=generator)[: self.p.fisher_samples].to(y.device)
            x, y = x[keep], y[keep]
        new = diagonal_fisher(model, params, x, y, data.task, self.p.fisher, batch_size=self.run.batch_size)
        anchor = {k: v.detach() for k, v in params.items()}
        if "offset" not in state or self.p.mode == "online":
            decay = self.p.gamma if "offset" in state else 0.0
            for k in params:
                old = state.get(f"fisher.{k}")
                state[f"fisher.{k}"] = new[k] if old is None else decay * old + new[k]
                state[f"anchor.{k}"] = anchor[k].clone()
            state["offset"] = torch.zeros((), device=anchor[next(iter(anchor))].device)
            return
        offset = state["offset"].double()
        for k in params:
            total, centre = state[f"fisher.{k}"], state[f"anchor.{k}"]
            summed = total + new[k]
            merged = torch.where(summed > 0, (total * centre + new[k] * anchor[k]) / summed.clamp_min(1e-30),
                                 anchor[k])
            offset = offset + (total.double() * (centre - merged).double() ** 2).sum()
            offset = offset + (new[k].double() * (anchor[k] - merged).double() ** 2).sum()
            state[f"fisher.{k}"], state[f"anchor.{k}"] = summed, merged
        state["offset"] = offset.float()

    def stats(self, state: MethodState) -> dict[str, Any]:
        return {"mode": self.p.mode, "fisher": self.p.fisher, **client_state_bytes(state)}
