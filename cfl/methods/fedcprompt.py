"""Fed-CPrompt (Bagwe, Yuan, Pan, Zhang, 2023, "Fed-CPrompt: Contrastive Prompt for Rehearsal-Free Federated
Continual Learning", arXiv 2307.04869, FL-ICML 2023; official code github.com/grbagwe/Fed-CPrompt): CODA-P's
prompt components on a frozen pretrained ViT (``model.train: components``, cfl/pretrained/coda_prompt.py),
federated by FedAvg over components, keys, attention vectors and head, with its two client-side pieces
(cfl/pretrained/contrastive_continual.py):

* task-specific prompts (the paper's asynchronous prompt learning): the components are split into one slice per
  task and a client on task ``t`` moves slice ``t`` only (its step gradient is zero on the other slices' rows:
  earlier tasks' prompts stay frozen, later ones wait for their task); each client uses the task it holds, so
  under an asynchronous schedule clients on different tasks train different slices in the same round;
* the contrastive continual loss C2L on the head's input feature (the [CLS] output): the client's model is pulled
  towards the round's global model and pushed away from the global model of the client's previous task,
  ``lam * max(0, sum_b (pull |z_b - z_glob,b|^2 - push |z_b - z_prev,b|^2) + margin)``, one hinge of the batch
  sum as the official ``TripletLoss`` (``sum_b pull |z_b - z_glob,b|^2`` on the client's first task;
  ``reduction: sample`` averages a hinge per sample instead), and, optionally, CODA-P's orthogonality penalty
  (``ortho``, 0 as in the official scripts).

The round's global model reaches the loss as a broadcast (the server keeps a copy of the trainable parameters
after each server step); it is the model the client downloads that round anyway, so it is counted as 0 bytes.
The previous task's model is each client's own copy of the global model at its task end (state, one trainable
subset per client). The cross-entropy's softmax runs over the client's current task's classes only
(``class_mask: current``, the code's old logits set to ``-inf``); ``seen``: every class seen so far.

The model is the official code's by default: prefix tuning in blocks 0-4 (``model.component_layers``, 5;
``models/vit_coda_p.py``). ``start: at-once`` (the default) puts every slice in the forward from the start, drawn
orthonormal, and runs under every schedule; ``start: orthogonal`` is the code's exclusion of future slices (a
task's rows enter the global model at its task's start, with their values of the run's first orthonormal draw:
cfl/methods/component_start.py), synchronous schedule only, since the server places a slice at the task end. See
docs/methods/fedcprompt.md for cfl's reading of the paper and code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods import component_start
from cfl.methods.base import ClientEndContext, LossContext, LossTerms, Method, Payload, ServerChange, ServerEvent, Step
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.class_mask import ClassMasked, class_mask_field
from cfl.methods.declarations import Computes, Requires, Sends
from cfl.ops.data_free_clients import logits_and_features
from cfl.ops.distill import evaluating, frozen
from cfl.pretrained.contrastive_continual import batch_contrastive_continual_loss, contrastive_continual_loss, task_rows
from cfl.tensors import Params


@dataclass(frozen=True)
class FedCPromptHyperparams:
    lam: float = field(1.0, "weight of the contrastive continual loss C2L (the official code adds it unweighted)",
                       min=0, max=WEIGHT_MAX)
    margin: float = field(1.0, "C2L's triplet margin (the official code's 1)", min=0, max=WEIGHT_MAX)
    pull: float = field(1000.0, "scale of the squared distance to the round's global model's feature (the "
                                "official code's 1e3)", min=0, max=WEIGHT_MAX)
    push: float = field(10.0, "scale of the squared distance to the previous task's global model's feature (the "
                              "official code's 1e1)", min=0, max=WEIGHT_MAX)
    reduction: str = field("batch", "C2L's reduction: batch (the official TripletLoss: one hinge of the batch's "
                            "summed distances, the first task's pull summed over the batch) or sample (a hinge per "
                            "sample, averaged)", choices=("batch", "sample"))
    ortho: float = field(0.0, "weight of CODA-P's orthogonality penalty on components, keys and attention vectors "
                              "(0: off, as the official Fed-CPrompt scripts run it)", min=0, max=WEIGHT_MAX)
    class_mask: str = class_mask_field("current")
    start: str = component_start.start_field("at-once", "every slice in the forward from the start, drawn "
                                                        "orthonormal, each task training its own")


class FedCPrompt(ClassMasked, Method):
    name = "fedcprompt"
    about = ("Fed-CPrompt: task-specific CODA-P prompt components and the contrastive continual loss C2L on a "
             "frozen pretrained ViT (Bagwe et al. 2023), FedAvg of components and head; model.train: components")
    Hyperparams = FedCPromptHyperparams
    requires = Requires(model_train="components", schedules=("synchronous",),
                        schedules_why="each task's components enter the global model at the synchronous task end",
                        schedules_unless=("start", "at-once"))
    sends = Sends(server_events=("start", "round", "task_end"), broadcast={"round": ("global",)},
                  client_events=("task_end",))
    computes = Computes(losses=("task", "extra"))

    def __init__(self, hparams: Any, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        pool = run_info.model.prompt.prompts.shape[0] if hasattr(run_info.model, "prompt") else 0
        if pool < run_info.num_tasks:
            raise ConfigError(f"method fedcprompt gives each task its own prompt components: model.prompt_pool "
                              f"{pool} is fewer than the stream's {run_info.num_tasks} tasks; raise prompt_pool")
        self.owner = task_rows(pool, run_info.num_tasks)

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:
        if cfg.weight_decay != 0:
            raise ConfigError(f"method fedcprompt freezes the prompt components of the other tasks, which weight "
                              f"decay would still shrink; set weight_decay: 0 (it is {cfg.weight_decay})")
        tasks = cfg.stream.num_tasks
        if tasks is not None and cfg.model.prompt_pool < tasks:
            raise ConfigError(f"method fedcprompt gives each task its own prompt components: model.prompt_pool "
                              f"{cfg.model.prompt_pool} is fewer than stream.num_tasks {tasks}; raise prompt_pool")
        component_start.check_start(cls.name, hparams, cfg)

    # ---- the round's global model, kept by the server and broadcast ----
    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        """The round's global model, kept; at the start only task 0's components, at a task end the next task's
        enter (``start``; the kept model then holds them)."""
        info, layered = self.run_info, bool(self.run_info.model.prompt.layers)
        change = None
        if ctx.event == "start":
            new = component_start.at_start(self.hparams, ctx.global_params, ctx.server, info.seed, info.num_tasks,
                                           layered)
            change = ServerChange(new) if new else None
        elif ctx.event == "task_end":
            change = component_start.at_task_end(self.hparams, ctx.global_params, ctx.server, info.seed,
                                                 info.num_tasks, ctx.task, layered)
            if change is None:
                return None
        ctx.server["global"] = frozen({**ctx.global_params, **(change.params if change else {})})
        return change

    def count_bytes(self, ctx: Payload) -> int | None:
        """The round's broadcast is the global model the client downloads that round anyway: 0 more bytes; every
        client keeps one copy of the trainable parameters (the previous task's global model)."""
        if ctx.kind == "client_state":
            return ctx.sizing.num_clients * ctx.sizing.model_bytes
        return 0 if ctx.kind == "round" else None

    # ---- the previous task's global model, kept by each client ----

    def client_end(self, ctx: ClientEndContext) -> None:
        """At the client's task end (``params``: the global model then): the next task's negative."""
        ctx.state["previous"] = frozen(ctx.params)

    # ---- one client's loss and step ----
    def loss(self, ctx: LossContext) -> LossTerms:
        if ctx.part == "task":
            return super().loss(ctx)
        model, params, x, task, server, state = self.run_info.model, ctx.params, ctx.x, ctx.task, ctx.server, ctx.state
        anchor = logits_and_features(model, params, x, task)[1]
        with torch.no_grad(), evaluating(model):
            positive = logits_and_features(model, server["global"], x, task)[1]
            negative = logits_and_features(model, state["previous"], x, task)[1] if "previous" in state else None
        h = self.hparams
        if h.reduction == "batch":  # a batch term on every entry: the engine's mean over the real samples keeps it
            term = batch_contrastive_continual_loss(anchor, positive, negative, h.margin, h.pull, h.push, ctx.weight)
            loss = h.lam * term.expand(x.shape[0])
        else:
            loss = h.lam * contrastive_continual_loss(anchor, positive, negative, h.margin, h.pull, h.push)
        if h.ortho:
            layered = bool(model.prompt.layers)
            loss = loss + h.ortho * component_start.penalty(h, params, self.owner, task, layered)
        return LossTerms(extra=loss)

    def step_gradient(self, step: Step) -> Params:
        """Only the rows of the client's current task's slice of components, keys and attention vectors move."""
        return component_start.task_rows_only(step.grads, self.owner, step.task)
