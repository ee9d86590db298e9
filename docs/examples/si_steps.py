"""Synaptic Intelligence (Zenke et al., ICML 2017) as a plugin: a path integral kept by step hooks."""

from dataclasses import dataclass

import torch

from cfl.plugin import ClientStart, Computes, Method, Quadratic, RoundTerms, Sends, Step, field, register


@dataclass(frozen=True)
class Hyperparams:
    c: float = field(0.1, "weight of the surrogate loss c * sum Omega (w - w*)^2", min=0.0)
    xi: float = field(1e-3, "damping of Omega's denominator", gt=0.0)


@register
class MySI(Method):
    name = "my-si"
    about = "SI written from docs/plugins.md"
    Hyperparams = Hyperparams
    sends = Sends(client_events=("task_end",))
    computes = Computes(terms=("penalty",), starts=("carry",))

    def round_terms(self, ctx):
        if "omega" not in ctx.state:
            return None
        return RoundTerms({k: Quadratic(2 * self.hparams.c * ctx.state["omega"][k], ctx.state["start"][k])
                           for k in ctx.global_params})

    def client_start(self, ctx):  # ctx.part == "carry": the running sums so far in this task, where it started
        path = ctx.state.get("path") or {k: torch.zeros_like(v) for k, v in ctx.global_params.items()}
        start = ctx.state.get("start") or {k: v.clone() for k, v in ctx.global_params.items()}
        return ClientStart(carry={"path": path, "start": start})

    def carry_step(self, step: Step):
        grads = step.grads
        if "omega" in step.state:  # the task loss alone: take out the surrogate's gradient
            grads = {k: g - 2 * self.hparams.c * step.state["omega"][k] * (step.params[k] - step.state["start"][k])
                     for k, g in grads.items()}
        path = {k: p - grads[k] * step.moved[k] for k, p in step.carry["path"].items()}
        return {"path": path, "start": step.carry["start"]}

    def count_bytes(self, ctx):
        if ctx.kind != "client_state":  # only the clients' state has no default worth keeping
            return None
        return ctx.sizing.num_clients * 3 * ctx.sizing.model_bytes

    def client_end(self, ctx):
        params, state = ctx.params, ctx.state
        if "path" not in state:  # no round of this task trained on this client
            state["start"] = {k: v.clone() for k, v in params.items()}
            return None
        old = state.get("omega", {})
        new = {k: state["path"][k] / ((v - state["start"][k]) ** 2 + self.hparams.xi) for k, v in params.items()}
        state["omega"] = {k: old[k] + new[k] if k in old else new[k] for k in params}
        state["start"] = {k: v.clone() for k, v in params.items()}
        del state["path"]
        return None
