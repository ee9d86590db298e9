"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
arXiv 1910.06378), option II control variates.

Each local step corrects the gradient by ``c - c_i`` (server and client control variates): the linear penalty
``<c - c_i, w>``, which the stacked path fuses into its step. After ``K`` local steps at learning rate ``lr`` (each
parameter's own under ``lr_groups``) from the round's global model ``x`` to ``y_i``, the client sets
``c_i+ = c_i - c + (x - y_i) / (K lr)`` (option II) and sends ``dc_i = c_i+ - c_i`` beside its model; the server
averages the models (``server_lr``: the paper's global step size) and sets ``c <- c + (1/N) sum_i dc_i`` over the
round's clients (``N``: all clients).
"""

from __future__ import annotations

import torch

from cfl.methods.base import ClientEndContext, ClientRound, Linear, Method, Payload, RoundTerms, ServerEvent
from cfl.methods.declarations import Computes, Sends
from cfl.tensors import State


class Scaffold(Method):
    name = "scaffold"
    about = "SCAFFOLD: local steps corrected by the control variates c - c_i (option II)"
    # the server's control variate travels with every round's model
    sends = Sends(server_events=("start", "round"), broadcast={"round": ("c",)}, client_events=("round",))
    computes = Computes(terms=("penalty",))

    def round_terms(self, ctx: ClientRound) -> RoundTerms:
        own = ctx.state.get("c", {})
        return RoundTerms({k: Linear(c - own[k] if k in own else c) for k, c in ctx.server["c"].items()})

    def client_end(self, ctx: ClientEndContext) -> State:
        params, state, server, training = ctx.params, ctx.state, ctx.server, ctx.training
        steps = max(training.steps, 1)
        own = state.get("c", {})
        # K lr per parameter: its own lr where lr_groups gives it one
        new = {k: own.get(k, torch.zeros_like(c)) - c + (training.global_params[k] - params[k]) *
               (1.0 / (steps * training.lr_of(k))) for k, c in server["c"].items()}
        delta = {k: v - own[k] if k in own else v.clone() for k, v in new.items()}
        state["c"] = new
        return {"dc": delta}

    def server_event(self, ctx: ServerEvent) -> None:
        server, n = ctx.server, self.run_info.num_clients
        if ctx.event == "start":
            server["c"] = {k: torch.zeros_like(v) for k, v in ctx.global_params.items()}
        for upload in ctx.uploads.values():
            server["c"] = {k: c + upload["dc"][k] / n for k, c in server["c"].items()}

    def count_bytes(self, ctx: Payload) -> int | None:
        """The clients' state: each client that has trained keeps ``c_i``, a model's worth."""
        return None if (s := ctx.sizing) is None else min(s.num_clients, s.rounds * s.clients_per_round) * s.model_bytes
