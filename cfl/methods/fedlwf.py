"""FedLwF: Learning without Forgetting (Li & Hoiem, ECCV 2016 / TPAMI 2017, arXiv 1606.09282) on each client.

At the end of task ``t`` every client keeps the task's final global model as its teacher (the "old model"),
with the heads it has trained (task-incremental: tasks ``0..t``; otherwise the one shared head). Every later
local step adds, per sample of the batch,

    lam * sum_{old heads j} KL( softmax(teacher(x, j) / T) || softmax(model(x, j) / T) )

to the cross-entropy: LwF's ``lambda_o * L_old`` (its soft cross-entropy less the teacher's entropy, the same
gradient). One model-sized teacher per client; nothing is uploaded. See docs/methods/fedlwf.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, Computes, LossContext, LossTerms, Method, Payload, Sends
from cfl.methods.bounds import TEMPERATURE_MAX, WEIGHT_MAX
from cfl.ops.distill import Teacher, distillation, frozen, head_weights


@dataclass(frozen=True)
class FedLwFHyperparams:
    lam: float = field(1.0, "lambda_o: weight of the distillation term (LwF paper: 1)", min=0.0, max=WEIGHT_MAX)
    temperature: float = field(2.0, "softmax temperature T of the distillation (LwF paper: 2)",
                               gt=0.0, max=TEMPERATURE_MAX)


class FedLwF(Method):
    name = "fedlwf"
    about = "FedLwF: each client distils the previous task's global model on its old heads (LwF)"
    Hyperparams = FedLwFHyperparams
    sends = Sends(client_events=("task_end",))
    computes = Computes(losses=("extra",))

    def count_bytes(self, ctx: Payload) -> int | None:
        """The clients' state: every client keeps one model-sized teacher and a float per head."""
        return None if (s := ctx.sizing) is None else s.num_clients * (s.model_bytes + 4 * s.num_tasks)

    def client_end(self, ctx: ClientEndContext) -> None:
        """At a task end (``params``: the task's final global model): it becomes the teacher."""
        params, data, state = ctx.params, ctx.data, ctx.state
        info = self.run_info
        state["teacher"] = frozen(params)
        state["heads"] = head_weights(info.num_tasks, info.scenario, data.task, next(iter(params.values())).device)

    def loss(self, ctx: LossContext) -> LossTerms:
        params, x, task, state = ctx.params, ctx.x, ctx.task, ctx.state
        if "teacher" not in state:  # the first task: no teacher yet
            return LossTerms(extra=torch.zeros(x.shape[0], device=x.device))
        teacher = Teacher(state["teacher"], state["heads"], self.hparams.lam)
        return LossTerms(extra=distillation(self.run_info.model, params, x, task, [teacher], self.hparams.temperature))
