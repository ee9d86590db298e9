"""MAS+FL: Memory Aware Synapses (Aljundi et al., ECCV 2018, arXiv 1711.09601) on each client.

At the end of task ``t`` every client computes the importance of each parameter on its local data of the
task at the global model ``w*_t`` (the paper's Eq. 2 with Eq. 4): the mean over the samples of the absolute
per-sample gradient of the squared L2 norm of the model's output (the logits of the sample's head),

    Omega_t,i = (1/N) sum_n | d ||f(x_n; w*_t)||_2^2 / d w_i |,

adds it to the importance of the earlier tasks (``Omega <- Omega + Omega_t``, as the authors' code does) and
anchors at the latest model (``w* <- w*_t``). Later local training adds the paper's Eq. 3 penalty, without 1/2:

    lambda * sum_i Omega_i (w_i - w*_i)^2     (gradient 2 lambda Omega (w - w*)).

State: two model-sized tensors per client. Nothing extra is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, ClientRound, Computes, Method, Payload, Quadratic, RoundTerms, Sends
from cfl.methods.bounds import SAMPLES_MAX, WEIGHT_MAX
from cfl.ops.fisher import output_norm_importance


@dataclass(frozen=True)
class MASHyperparams:
    lam: float = field(1.0, "lambda: weight of the MAS penalty lambda * sum Omega (w - w*)^2 (no 1/2, as the "
                       "paper's Eq. 3; the authors used 1 for object recognition)", min=0.0, max=WEIGHT_MAX)
    importance_samples: int | None = field(None, "use at most this many local samples (a seeded random subset) "
                                           "for the importance; null: all", min=1, max=SAMPLES_MAX)


class MAS(Method):
    name = "mas"
    about = "MAS+FL: per-client importance |d||f(x)||^2/dw| penalty lambda sum Omega (w - w*)^2 on finished tasks"
    Hyperparams = MASHyperparams
    sends = Sends(client_events=("task_end",))
    computes = Computes(terms=("penalty",))

    def round_terms(self, ctx: ClientRound) -> RoundTerms | None:
        if "omega" not in (state := ctx.state):  # no finished task yet
            return None
        # Quadratic is weight/2 (w - anchor)^2: weight 2 lambda Omega gives the paper's lambda Omega (w - w*)^2
        lam = 2.0 * self.hparams.lam
        return RoundTerms({k: Quadratic(lam * state["omega"][k], state["anchor"][k]) for k in ctx.global_params})

    def count_bytes(self, ctx: Payload) -> int | None:
        """The clients' state: every client keeps its summed importance and an anchor, two model-sized tensors."""
        return None if (s := ctx.sizing) is None else s.num_clients * 2 * s.model_bytes

    def client_end(self, ctx: ClientEndContext) -> None:
        model, params, data, state, generator = ctx.model, ctx.params, ctx.data, ctx.state, ctx.generator
        x = data.x
        cap = self.hparams.importance_samples
        if cap is not None and len(x) > cap:
            x = x[torch.randperm(len(x), generator=generator)[:cap].to(x.device)]
        new = output_norm_importance(model, params, x, data.task, batch_size=self.run_info.batch_size)
        old = state.get("omega", {})
        state["omega"] = {k: old[k] + new[k] if k in old else new[k] for k in params}
        state["anchor"] = {k: v.detach().clone() for k, v in params.items()}
