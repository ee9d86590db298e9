"""FLwF-2T: LwF with two teachers (Usmanova, Portet, Lalanda, Vega, "A distillation-based approach integrating
continual learning and federated learning for pervasive services", 2021, arXiv 2109.04197), on each client.

The paper's local loss is ``alpha CE + beta KD_T(own) + (1 - alpha - beta) KD_T(server)``: ``own`` is the
client's own model of the previous task (its local model after the last round it trained in a finished task),
``server`` the server's model. The engine adds a method's terms to a cross-entropy of weight 1, so every local
step adds, per sample,

    beta/alpha * KD_T(own) + (1 - alpha - beta)/alpha * KD_T(server)

(the paper's loss divided by ``alpha``: the same minimiser, gradients scaled by ``1/alpha``), with ``KD_T`` the
distillation of the teacher's old heads (cfl/ops/distill.py). The server teacher is the final global model of
the previous task, which the client downloads at the task end: our reading where the paper's "current" server
model would be the model of each round, which the method interface does not hand to ``loss``; with one
round per task the two are the same model. Three model-sized tensors per client (the two teachers and the
client's latest local model); nothing is uploaded. See docs/methods/flwf2t.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods.base import ClientEndContext, Computes, LossContext, LossTerms, Method, Payload, Sends
from cfl.methods.bounds import TEMPERATURE_MAX
from cfl.ops.distill import Teacher, distillation, frozen, head_weights


@dataclass(frozen=True)
class FLwF2THyperparams:
    alpha: float = field(0.4, "weight of the cross-entropy in the paper's loss (re-implementations: 0.4)",
                         gt=0.0, max=1.0)
    beta: float = field(0.3, "weight of the client's own previous-task teacher (re-implementations: 0.3); the "
                        "server teacher gets 1 - alpha - beta", min=0.0, max=1.0)
    temperature: float = field(2.0, "softmax temperature T of both distillations (re-implementations: 2)",
                               gt=0.0, max=TEMPERATURE_MAX)


class FLwF2T(Method):
    name = "flwf2t"
    about = "FLwF-2T: each client distils its own previous-task model and the server's model (two teachers)"
    Hyperparams = FLwF2THyperparams
    sends = Sends(client_events=("round", "task_end"))
    computes = Computes(losses=("extra",))

    @classmethod
    def check(cls, hparams: FLwF2THyperparams, cfg: Config) -> None:  # noqa: ARG003
        if hparams.alpha + hparams.beta > 1.0:
            raise ConfigError(f"'method.alpha' + 'method.beta' = {hparams.alpha} + {hparams.beta} exceeds 1: the "
                              f"server teacher's weight 1 - alpha - beta would be negative; lower one of them")

    def __init__(self, hparams: FLwF2THyperparams, run_info: object) -> None:
        super().__init__(hparams, run_info)
        self.check(hparams, run_info)  # also when built directly

    def count_bytes(self, ctx: Payload) -> int | None:
        """The clients' state: every client keeps up to three model-sized tensors (two teachers, its latest local
        model), each with a float per head."""
        return None if (s := ctx.sizing) is None else s.num_clients * 3 * (s.model_bytes + 4 * s.num_tasks)

    def client_end(self, ctx: ClientEndContext) -> None:
        """After a round: keep the client's trained model. At a task end (``params``: the final global model):
        it becomes the server teacher, and the client's latest local model its own teacher (a client that did
        not train since keeps its older own teacher, or has none: weight 0)."""
        event, params, data, state = ctx.event, ctx.params, ctx.data, ctx.state
        info, device = self.run_info, next(iter(params.values())).device
        heads = head_weights(info.num_tasks, info.scenario, data.task, device)
        if event == "round":
            state["latest"], state["latest_heads"] = frozen(params), heads
            return
        state["global"], state["global_heads"] = frozen(params), heads
        if "latest" in state:
            state["own"], state["own_heads"] = state.pop("latest"), state.pop("latest_heads")

    def loss(self, ctx: LossContext) -> LossTerms:
        params, x, task, state = ctx.params, ctx.x, ctx.task, ctx.state
        if "global" not in state:  # the first task: no teacher yet
            return LossTerms(extra=torch.zeros(x.shape[0], device=x.device))
        hp = self.hparams
        teachers = [Teacher(state["global"], state["global_heads"], (1.0 - hp.alpha - hp.beta) / hp.alpha)]
        if "own" in state:  # a client that never trained in a finished task has no own teacher
            teachers.append(Teacher(state["own"], state["own_heads"], hp.beta / hp.alpha))
        return LossTerms(extra=distillation(self.run_info.model, params, x, task, teachers, hp.temperature))
