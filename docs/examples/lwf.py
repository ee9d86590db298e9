"""Learning without Forgetting as a cfl plugin (Li & Hoiem, ECCV 2016, arXiv 1606.09282).

Each client keeps the global model of the last finished task (the "old" model). During later local
training, the loss adds ``lambda * T^2 * KL(softmax(old(x)/T) || softmax(new(x)/T))`` per sample, for
every old task's head (task-incremental) or for the shared head. Nothing is sent.

Run it with:  cfl run configs/quickstart.yaml --plugin docs/examples/lwf.py --set method.name=lwf
The built-in ``fedlwf`` (docs/methods/fedlwf.md) is this method; ``lwf`` stays the plugin's own name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import functional_call

from cfl.plugin import (
    ClientEndContext,
    Computes,
    LossContext,
    LossTerms,
    Method,
    Sends,
    field,
    register,
)


@dataclass(frozen=True)
class LwFHyperparams:
    lam: float = field(1.0, "weight of the distillation term", min=0.0)
    temperature: float = field(2.0, "softmax temperature T", gt=0.0)


@register
class LwF(Method):
    name = "lwf"
    about = "LwF: distil the previous task's global model on current data (example plugin)"
    Hyperparams = LwFHyperparams
    sends = Sends(client_events=("task_end",))  # nothing to do after rounds
    computes = Computes(losses=("extra",))

    def client_end(self, ctx: ClientEndContext) -> None:
        """At a task end: remember the task's final global model and which heads it has trained."""
        params, data, state = ctx.params, ctx.data, ctx.state
        old_heads = torch.zeros(self.run_info.num_tasks)
        old_heads[: data.task + 1 if self.run_info.scenario == "task" else 1] = 1.0
        state["old"] = {k: v.clone() for k, v in params.items()}
        state["old_heads"] = old_heads

    def loss(self, ctx: LossContext) -> LossTerms:
        params, x, task, state = ctx.params, ctx.x, ctx.task, ctx.state
        if "old" not in state:  # first task: nothing to remember yet
            return LossTerms(extra=torch.zeros(x.shape[0], device=x.device))
        t, model = self.hparams.temperature, self.run_info.model
        total = torch.zeros(x.shape[0], device=x.device)
        for j in range(self.run_info.num_tasks):
            head = torch.full_like(task, j)
            with torch.no_grad():
                target = F.softmax(functional_call(model, state["old"], (x, head)) / t, dim=-1)
            log_new = F.log_softmax(functional_call(model, params, (x, head)) / t, dim=-1)
            kl = (target * (torch.log(target.clamp_min(1e-12)) - log_new)).sum(-1)
            total = total + state["old_heads"][j] * kl
        return LossTerms(extra=self.hparams.lam * t * t * total)
