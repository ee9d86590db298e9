"""EWC+FL: Elastic Weight Consolidation (Kirkpatrick et al., PNAS 2017, arXiv 1612.00796) on each client.

At the end of task ``t`` every client computes the diagonal Fisher ``F_t`` of that task on its local data
at the global model ``w*_t`` (the anchor). Later local training adds

    separate: lambda/2 * sum_{t seen} sum_i F_t,i (w_i - w*_t,i)^2
    online:   lambda/2 * sum_i F*_i (w_i - w*_i)^2,  F* <- gamma F* + F_t,  w* <- w*_t  (Schwarz et al. 2018)

Storage is two model-sized tensors per client in both modes: a sum of quadratics is one quadratic, so
``separate`` keeps ``A = sum_t F_t``, the Fisher-weighted centre ``m = sum_t F_t w*_t / A`` and the constant
``c``: ``sum_t F_t (w - w*_t)^2 = A (w - m)^2 + c`` exactly (same gradient ``lambda * sum_t F_t (w - w*_t)``),
with shapes that do not grow with the tasks. The constant ``c`` changes no gradient and is not kept.
Nothing extra is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, ClientRound, Computes, Method, Payload, Quadratic, RoundTerms, Sends
from cfl.methods.bounds import SAMPLES_MAX, WEIGHT_MAX
from cfl.ops.fisher import diagonal_fisher


@dataclass(frozen=True)
class EWCHyperparams:
    lam: float = field(10.0, "lambda: weight of the EWC penalty lambda/2 * sum F (w - w*)^2", min=0.0, max=WEIGHT_MAX)
    mode: str = field("separate", "one penalty term per finished task, or one online-consolidated term",
                      choices=("separate", "online"))
    gamma: float = field(1.0, "online mode: decay of the consolidated Fisher, F <- gamma F + F_new",
                         min=0.0, max=1.0)
    fisher: str = field("empirical", "empirical: squared gradients of log p(true label); true: expectation "
                        "over the model's predictive distribution", choices=("empirical", "true"))
    fisher_samples: int | None = field(None, "use at most this many local samples (a seeded random subset) "
                                       "for the Fisher; null: all", min=1, max=SAMPLES_MAX)


class EWC(Method):
    name = "ewc"
    about = "EWC+FL: per-client diagonal-Fisher penalty lambda/2 sum F (w - w*)^2 on finished tasks"
    Hyperparams = EWCHyperparams
    sends = Sends(client_events=("task_end",))
    computes = Computes(terms=("penalty",))

    def round_terms(self, ctx: ClientRound) -> RoundTerms | None:
        if "fisher" not in (state := ctx.state):  # no finished task yet
            return None
        return RoundTerms({k: Quadratic(self.hparams.lam * state["fisher"][k], state["anchor"][k])
                           for k in ctx.global_params})

    def count_bytes(self, ctx: Payload) -> int | None:
        """The clients' state: every client keeps a Fisher and an anchor, two model-sized tensors."""
        return None if (s := ctx.sizing) is None else s.num_clients * 2 * s.model_bytes

    def client_end(self, ctx: ClientEndContext) -> None:
        model, params, data, state, generator = ctx.model, ctx.params, ctx.data, ctx.state, ctx.generator
        hp = self.hparams
        x, y = data.x, data.y
        if hp.fisher_samples is not None and len(y) > hp.fisher_samples:
            keep = torch.randperm(len(y), generator=generator)[: hp.fisher_samples].to(y.device)
            x, y = x[keep], y[keep]
        new = diagonal_fisher(model, params, x, y, data.task, hp.fisher, batch_size=self.run_info.batch_size)
        anchor = {k: v.detach() for k, v in params.items()}
        if "fisher" not in state or hp.mode == "online":
            decay = hp.gamma if "fisher" in state else 0.0
            old = state.get("fisher", {})
            state["fisher"] = {k: new[k] if k not in old else decay * old[k] + new[k] for k in params}
            state["anchor"] = {k: anchor[k].clone() for k in params}
            return
        fisher, centre = state["fisher"], state["anchor"]
        summed = {k: fisher[k] + new[k] for k in params}
        state["anchor"] = {k: torch.where(summed[k] > 0, (fisher[k] * centre[k] + new[k] * anchor[k])
                                          / summed[k].clamp_min(1e-30), anchor[k]) for k in params}
        state["fisher"] = summed
