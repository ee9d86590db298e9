"""SI+FL: Synaptic Intelligence (Zenke, Poole & Ganguli, "Continual Learning Through Synaptic Intelligence",
ICML 2017, arXiv 1703.04200) on each client.

During local training a client sums, per parameter, the path integral of its task loss along its own steps
(the paper's Eq. 3 estimate, with the update the optimiser actually took):

    omega_i += -g_i * (theta_i(t+1) - theta_i(t)),   g = the step's gradient without SI's own penalty,

kept across the rounds of a task (a step hook: ``carry_step``). At the end of task ``t``, with the task's final
global model ``theta*_t`` (the paper's Eq. 5, the task's total move taken on the global model):

    Omega_i += omega_i / ((theta*_t,i - theta*_{t-1},i)^2 + xi),   omega <- 0,   anchor <- theta*_t,

(``clip: true``: the authors' code, ``Omega_i <- max(0, Omega_i + ...)``),

where ``theta*_{-1}`` is the global model the client first trained from. Later local training adds the paper's
Eq. 4 surrogate ``c * sum_i Omega_i (theta_i - anchor_i)^2``. cfl's reading for federated training: each client
sums its own local path and divides by the global model's move over the task (a client's local path restarts
from the global model each round, so its own end-to-end move is not defined). State: four model-sized tensors
per client (path, start, importance, anchor = start after the first task). Nothing extra is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, Computes, Method, Payload, Quadratic, Sends, Step
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.client_hooks import ClientRound, ClientRoundStart, ClientStart, RoundTerms
from cfl.tensors import State


@dataclass(frozen=True)
class SIHyperparams:
    c: float = field(0.1, "c: weight of the surrogate loss c * sum Omega (w - w*)^2 (the paper's Eq. 4; 0.1 on "
                     "split MNIST and permuted MNIST in Zenke et al. 2017)", min=0.0, max=WEIGHT_MAX)
    xi: float = field(1e-3, "xi: damping of the importance's denominator (Delta^2 + xi; 1e-3 in the paper; "
                      "at most 1, where Omega, made of squared steps Delta^2 << 1, all but vanishes)", gt=0.0, max=1.0)
    clip: bool = field(False, "the authors' code (ganguli-lab/pathint): Omega <- max(0, Omega + omega / "
                       "(Delta^2 + xi)) at each task end; false: the paper's, unclipped (negative entries appear "
                       "where weight decay or momentum moves a parameter up its loss's gradient)")


class SI(Method):
    name = "si"
    about = "SI+FL: per-client path-integral importance (Synaptic Intelligence), penalty c sum Omega (w - w*)^2"
    Hyperparams = SIHyperparams
    sends = Sends(client_events=("task_end",))
    computes = Computes(terms=("penalty",), starts=("carry",))

    def round_terms(self, ctx: ClientRound) -> RoundTerms | None:
        if "omega" not in (state := ctx.state):  # no finished task yet
            return None
        c = 2.0 * self.hparams.c  # Quadratic is weight/2 (w - anchor)^2: 2c Omega gives the paper's c Omega (w - w*)^2
        return RoundTerms({k: Quadratic(c * state["omega"][k], state["start"][k]) for k in ctx.global_params})

    def client_start(self, ctx: ClientRoundStart) -> ClientStart:
        path = ctx.state.get("path") or {k: torch.zeros_like(v) for k, v in ctx.global_params.items()}
        start = ctx.state.get("start") or {k: v.detach().clone() for k, v in ctx.global_params.items()}
        return ClientStart(carry={"path": path, "start": start})

    def carry_step(self, step: Step) -> State:
        grads = step.grads
        if "omega" in step.state:  # the task loss's gradient: leave out the surrogate's 2c Omega (w - w*)
            c, omega, anchor = self.hparams.c, step.state["omega"], step.state["start"]
            grads = {k: g - 2.0 * c * omega[k] * (step.params[k] - anchor[k]) for k, g in grads.items()}
        path = {k: p - grads[k] * step.moved[k] for k, p in step.carry["path"].items()}
        return {"path": path, "start": step.carry["start"]}

    def count_bytes(self, ctx: Payload) -> int | None:
        """The clients' state: each keeps its path integral, the task's start and its importance (the anchor: start)."""
        return None if (s := ctx.sizing) is None else s.num_clients * 3 * s.model_bytes

    def client_end(self, ctx: ClientEndContext) -> None:
        params, state = ctx.params, ctx.state
        if "path" not in state:  # the client never trained in this task (none of its rounds): nothing learnt
            state["start"] = {k: v.detach().clone() for k, v in params.items()}
            return
        xi, old = self.hparams.xi, state.get("omega", {})
        new = {k: state["path"][k] / ((v - state["start"][k]) ** 2 + xi) for k, v in params.items()}
        total = {k: old[k] + new[k] if k in old else new[k] for k in params}
        state["omega"] = {k: v.clamp(min=0.0) for k, v in total.items()} if self.hparams.clip else total
        state["start"] = {k: v.detach().clone() for k, v in params.items()}
        del state["path"]
