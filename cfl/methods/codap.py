"""CODA-Prompt (Smith et al., CVPR 2023, "CODA-Prompt: COntinual Decomposed Attention-based Prompting for
Rehearsal-Free Continual Learning"; official code github.com/GT-RIPL/CODA-Prompt, models/zoo.py), federated by
FedAvg over the prompt components, their keys, their attention vectors and the head. The model
(``model.train: components``, cfl/pretrained/coda_prompt.py and adapted.py) weights each of ``prompt_pool``
components by ``cos(query * A_m, K_m)`` of the frozen backbone's [CLS] feature (the query), prepends their
weighted sum (``prompt_length`` tokens) after [CLS] and classifies the [CLS] output. This file is one client's loss
beyond the cross-entropy: the orthogonality penalty ``ortho * (mean((K K^T - I)^2) + mean((A A^T - I)^2) +
mean((P P^T - I)^2))`` (the paper's Eq. 7, the code's ``ortho_penalty`` times ``ortho_mu``).

Which ``ortho_penalty``: the repository's two versions differ. Its beta release (commit 22948d2, April 2023)
multiplies the mean by 1e-6 (and its scripts ran ``ortho_mu`` 0.1: a weight of 1e-7); the current code (605ac87,
June 2023, "online ortho init") drops the factor and re-initialises each task's components by Gram-Schmidt, so its
scripts set ``ortho_mu`` 0.0. cfl follows the current form (``ortho_form: current``, the default): cfl trains
every component at every task with no Gram-Schmidt re-initialisation, so the penalty is what keeps the components
apart and must act at the weight it is given (with the 1e-6 factor, 0.1 would leave it all but off).
``ortho_form: beta`` is the beta release's penalty, times 1e-6.

cfl's reading: the official code's form is the default. The model (``model.component_layers``, 5) prefixes keys
and values of blocks 0-4 with one component set per block (``0``: prompt tuning, the weighted prompt prepended
after [CLS], cfl's form before 2026-12-03). ``start: gram-schmidt`` (cfl/methods/component_start.py) gives each task
its own ``pool / tasks`` components: they enter the global model at the synchronous task end, drawn by
Gram-Schmidt against the trained ones; later tasks' components are zero until then and earlier ones are frozen
(each client's step moves its task's slice only, the code's ``detach``), and the penalty runs over the components
seen so far (the code's ``K[0:f]``); so the default ``ortho`` is 0.0, the current scripts' ``--prompt_param 100 8
0.0``. ``start: at-once`` trains every component at every task (the form of cfl's records before 2026-12-03, with
``ortho`` 0.1 and ``model.component_layers: 0``). Components, keys and attention start with orthonormal rows. The
cross-entropy's softmax runs over the current task's classes only (``class_mask: current``, the code's
``logits[:, :last_valid_out_dim] = -inf``); ``seen``: every class seen so far."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cfl.config.keys import Config
from cfl.config.schema import field
from cfl.methods import component_start
from cfl.methods.base import Computes, LossContext, LossTerms, Method, Requires, ServerChange, ServerEvent, Step
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.class_mask import ClassMasked, class_mask_field
from cfl.methods.declarations import Sends
from cfl.pretrained.contrastive_continual import task_rows
from cfl.tensors import Params

#: the factor inside the beta release's ``ortho_penalty`` (GT-RIPL/CODA-Prompt 22948d2, models/zoo.py)
BETA_FACTOR = 1e-6


@dataclass(frozen=True)
class CodaPHyperparams:
    ortho: float = field(0.0, "weight of the orthogonality penalty on components, keys and attention vectors "
                              "(the official code's ortho_mu: 0.0 in its current scripts; cfl's at-once records "
                              "used 0.1)", min=0, max=WEIGHT_MAX)
    ortho_form: str = field("current", "the official ortho_penalty's version: current (commit 605ac87, the mean of "
                                       "squares) or beta (22948d2, that times 1e-6)", choices=("current", "beta"))
    class_mask: str = class_mask_field("current")
    start: str = component_start.start_field("gram-schmidt")


class CodaP(ClassMasked, Method):
    name = "codap"
    about = ("CODA-Prompt: attention-weighted prompt components on a frozen pretrained ViT (Smith et al. 2023), "
             "FedAvg of components, keys, attention vectors and head; model.train: components")
    Hyperparams = CodaPHyperparams
    requires = Requires(model_train="components", schedules=("synchronous",),
                        schedules_why="each task's components enter the global model at the synchronous task end",
                        schedules_unless=("start", "at-once"))
    sends = Sends(server_events=("start", "task_end"))
    computes = Computes(losses=("task", "extra"))

    def __init__(self, hparams: Any, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        #: each component row's task under a per-task start (None: every row trains at every task)
        self.owner = (task_rows(run_info.model.prompt.prompts.shape[0], run_info.num_tasks)
                      if component_start.per_task(hparams) else None)

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:
        component_start.check_start(cls.name, hparams, cfg)

    def _layered(self) -> bool:
        return bool(self.run_info.model.prompt.layers)

    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        """At the start: task 0's components only; at a task end: the next task's enter."""
        info = self.run_info
        if ctx.event == "start":
            new = component_start.at_start(self.hparams, ctx.global_params, ctx.server, info.seed, info.num_tasks,
                                           self._layered())
            return ServerChange(new) if new else None
        return component_start.at_task_end(self.hparams, ctx.global_params, ctx.server, info.seed, info.num_tasks,
                                           ctx.task, self._layered())

    def step_gradient(self, step: Step) -> Params:
        """Under a per-task start, only the client's task's components move (earlier ones are frozen)."""
        if self.owner is None:
            return step.grads
        return component_start.task_rows_only(step.grads, self.owner, step.task)

    def loss(self, ctx: LossContext) -> LossTerms:
        if ctx.part == "task":
            return super().loss(ctx)
        if not self.hparams.ortho:  # off (the default): no penalty to compute
            return LossTerms(extra=ctx.x.new_zeros(ctx.x.shape[0]))
        penalty = component_start.penalty(self.hparams, ctx.params, self.owner, ctx.task, self._layered(),
                                          ("prompt.keys", "prompt.attention", "prompt.prompts"))
        if self.hparams.ortho_form == "beta":
            penalty = penalty * BETA_FACTOR
        return LossTerms(extra=self.hparams.ortho * penalty * ctx.x.new_ones(ctx.x.shape[0]))
