"""FediCaRL: iCaRL (Rebuffi, Kolesnikov, Sperl, Lampert, "iCaRL: Incremental Classifier and Representation
Learning", CVPR 2017, arXiv 1611.07725) on each client, the FCL papers' "FediCaRL" baseline row (GLFC, TARGET).
Class-incremental. See docs/methods/fedicarl.md.

At a client's task end (``params``: the task's final global model): the model becomes the client's old model
(its teacher), the task's classes join the client's old classes (every class of the tasks it finished: the old
model's, as the official code's ``old_cl``), and the client's exemplar memory of ``memory_size`` slots is refilled
by herding (Algorithm 4, shared with GLFC: :func:`cfl.ops.glfc_memory.herd_into`): ``memory_size // learned``
exemplars per class it learned, old sets cut to their first exemplars, new ones herded on the L2-normalised
features at the head's input.

Every local step appends ``replay_batch_size`` exemplars to the batch (``samples``) and replaces the cross-entropy by
iCaRL's loss (``loss``'s task part), per sample the mean over the columns of
``BCE(sigmoid(z_c), target_c)``, ``target_c = sigmoid(z_old_c)`` of the old model for an old class ``c`` and the
one-hot label elsewhere: classification and distillation in one term, as the official code's ``loss_class``
(GLFC's code-form relation distillation is this loss: :func:`cfl.ops.glfc_losses.relation_distillation`).
Before a client's first task end it is the one-hot BCE. Nothing is communicated beyond FedAvg's model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch.func import functional_call

from cfl.config.schema import field
from cfl.methods.base import ClientEndContext, Draw, LossContext, LossTerms, Method, Payload, SamplesContext
from cfl.methods.bounds import SAMPLES_MAX
from cfl.methods.declarations import Computes, Requires, Sends
from cfl.methods.episodic_memory import draw_memory
from cfl.ops.distill import evaluating, frozen
from cfl.ops.features import head_features
from cfl.ops.glfc_losses import relation_distillation
from cfl.ops.glfc_memory import herd_into

#: the columns iCaRL's BCE averages over: the classes seen so far (cfl's class-incremental mask, the growing head
#: of the FCL papers' code) or all the head's (the official iCaRL code's fixed head, future classes' target 0)
COLUMNS = ("seen", "all")


@dataclass(frozen=True)
class FediCaRLHyperparams:
    memory_size: int = field(2000, "exemplar slots per client, shared equally by the classes it learned (iCaRL: "
                             "K = 2000)", min=1, max=SAMPLES_MAX)
    replay_batch_size: Optional[int] = field(None, "exemplars appended to each local step (null: the run's "
                                             "batch_size; iCaRL mixes them into the training set)",
                                             min=1, max=SAMPLES_MAX)
    columns: str = field("seen", "the columns the BCE averages over: seen (the classes seen so far, as every cfl "
                         "loss in class-incremental runs) or all (the official iCaRL code's whole head)",
                         choices=COLUMNS)


class FediCaRL(Method):
    name = "fedicarl"
    about = "FediCaRL: iCaRL on each client: herding exemplars replayed, sigmoid/BCE distillation of the old model"
    Hyperparams = FediCaRLHyperparams
    sends = Sends(client_events=("task_end",))
    requires = Requires(scenarios=("class",), scenarios_why="iCaRL distils the old classes' columns of one head and "
                                                            "herds exemplars per class")
    computes = Computes(losses=("task",), draws=("replay",))

    def count_bytes(self, ctx: Payload) -> int | None:
        """Every client: its memory (input, label, task id (int64), valid flag per slot), a teacher, the old classes."""
        return None if (s := ctx.sizing) is None else s.num_clients * (
            self.hparams.memory_size * (s.sample_bytes + 8 + 8 + 1) + s.model_bytes + s.num_classes)

    def loss(self, ctx: LossContext) -> LossTerms:
        """Per sample, iCaRL's BCE over the columns, old classes' targets from the old model."""
        logits, y, x, task, allowed, state = ctx.logits, ctx.y, ctx.x, ctx.task, ctx.allowed, ctx.state
        every = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
        columns = every if allowed is None or self.hparams.columns == "all" else allowed
        if "teacher" not in state:  # no client of the step has finished a task: the one-hot BCE
            old, old_logits = torch.zeros_like(every), torch.zeros_like(logits)
        else:  # a client yet to finish one has a zero teacher and no old class (stacked states): one-hot targets
            old = state["old_classes"]
            with evaluating(self.run_info.model):
                old_logits = functional_call(self.run_info.model, state["teacher"], (x, task)).detach()
        return LossTerms(task=relation_distillation(logits, y, old_logits, columns, old & columns, "code"))

    def samples(self, ctx: SamplesContext) -> Draw | None:
        size, info = self.hparams.replay_batch_size, self.run_info
        return Draw(replay=draw_memory(ctx.state, ctx.generator, size or info.batch_size))

    def client_end(self, ctx: ClientEndContext) -> None:
        """At a task end: the task's final global model becomes the teacher, the task's classes old, and the memory
        is refilled by herding on its features."""
        model, params, data, state = ctx.model, ctx.params, ctx.data, ctx.state
        classes = self.run_info.task_classes
        if len(classes) <= data.task:
            raise ValueError(f"fedicarl: run_info.task_classes names {len(classes)} tasks, not task {data.task}'s "
                             "classes; build RunInfo with task_classes (the engine does)")
        device = next(iter(params.values())).device
        old = state.get("old_classes", torch.zeros(self.run_info.num_classes, dtype=torch.bool, device=device))
        old = old.clone()
        old[list(classes[data.task])] = True
        state["old_classes"], state["teacher"] = old, frozen(params)
        if len(data.y) == 0:  # a client without samples of the task keeps its memory
            return
        features, _ = head_features(model, params, data.x, data.task)
        herd_into(state, data.x, data.y, data.task, features, self.hparams.memory_size)
