"""Powder (Piao, Zhang, Liu, Liang, ICML 2024, "Federated Continual Learning via Prompt-based Dual Knowledge
Transfer"; official code github.com/piaohongming/Powder, read at commit ae7beeb: ``src/fl_main_hard.py``,
``src/prompt_hard.py``, ``src/models_Cprompt/vit_coda_p_hard.py``, ``src/Fed_utils.py``) on a frozen pretrained
ViT, task-incremental. Every task owns its CODA-P components (``model.train: task-components``,
cfl/pretrained/task_prompts.py); an input of task ``g`` composes its prompt from the ``top_k`` tasks most
correlated with ``g``, each task's components mixed by its row of the task correlation ``W``
(cfl/pretrained/task_correlation.py): the forward transfer of a new task from the trained ones, and the backward
transfer of an old task from the tasks trained after it (its row of ``W`` is recomputed, its components stay).

One client's step: the cross-entropy over its task's classes (the task's head) plus, from the run's second round,
``ntd *`` the not-true distillation (tau 3, FedNTD) from the round's global model, the samples weighted by a softmax
over the batch of ``1 - max_j F[y, j]`` (``F``: the class correlation; the code's ``fc_weight``). A step moves its
task's components, keys, attention vectors and head only (the code gives the other tasks' rows no gradient).

The server: each task's components and head are the mean of the clients that trained it in the round (the code's
row replacement: one client a task there); each client sends, with its model, its task's descriptor (the mean
score of its images at the round's global model against every trained task's composed components) and its classes'
descriptors; at a round where some client began a task, ``W``, each task's selection and ``F`` are recomputed from
the latest descriptors and travel in the model (``prompt.mixing``, ``prompt.selection``) and the broadcast.

cfl's reading (docs/methods/powder.md): the code recomputes ``W`` on the server from every task's training images
at the first round of each stage, before the clients train; in cfl the clients send their descriptors with the
round's model, so a new ``W`` holds from the stage's second round (the first trains each new task on its own
components, ``W``'s identity row); the descriptors are at the round's global model with the current ``W`` (the
code keeps a copy of older rows for them); a task's rows start orthonormal in one draw with every other task's
(the code draws each stage's by Gram-Schmidt against the trained rows); tasks are the stream's, several clients may
hold one (their mean; the code gives each client stage its own task)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods.base import (
    ClientEndContext,
    Computes,
    LossContext,
    LossTerms,
    Method,
    Params,
    Payload,
    Requires,
    Sends,
    ServerChange,
    ServerEvent,
    State,
    Step,
)
from cfl.methods.bounds import WEIGHT_MAX
from cfl.ops.distill import evaluating, frozen
from cfl.ops.not_true_distillation import batch_softmax_weights, not_true_distillation
from cfl.pretrained.task_correlation import class_weights, task_mixing, task_selection
from cfl.pretrained.task_prompts import component_scores

#: each task's own rows: moved by its clients' steps, replaced by their mean at the server
ROWS = ("prompt.keys", "prompt.attention", "prompt.prompts", "head.weight", "head.bias")
#: set by the server only
SET_BY_SERVER = ("prompt.mixing", "prompt.selection")
#: images per forward when a client takes its descriptors
QUERY_BATCH = 256


@dataclass(frozen=True)
class PowderHyperparams:
    ntd: float = field(1.0, "weight of the not-true distillation from the round's global model (the code's 1)",
                       min=0, max=WEIGHT_MAX)
    tau: float = field(3.0, "the distillation's temperature (the code's 3)", gt=0, max=1e6)
    top_k: int = field(3, "tasks whose composed components make an input's prompt (the code's "
                          "topk_for_task_selection, 3)", min=1, max=4096)
    task_power: int = field(30, "the exponent of the task similarity in W (the code's task_index, 30)", min=1,
                            max=1000)
    class_power: int = field(30, "the exponent of the class similarity in F (the code's class_index, 30)", min=1,
                             max=1000)
    class_top_k: int = field(3, "entries kept in each row of F, the class's own included (the code's "
                                "topk_for_class, 3)", min=1, max=4096)


class Powder(Method):
    name = "powder"
    about = ("Powder: per-task CODA-P components composed by the task correlation (forward and backward transfer), "
             "not-true distillation weighted by the class correlation, each task's rows from its clients (Piao et "
             "al. 2024); task-incremental, model.train: task-components")
    Hyperparams = PowderHyperparams
    requires = Requires(model_train="task-components")
    sends = Sends(server_events=("start", "round"), broadcast={"round": ("global", "class_weight")},
                  client_events=("round",))
    computes = Computes(losses=("task",))

    def __init__(self, hparams: Any, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        if run_info.scenario != "task":
            raise ConfigError(f"method powder composes each input's prompt from its task's row of the task "
                              f"correlation, so the task must be known at test time: it runs task-incremental "
                              f"(stream.scenario: task), not {run_info.scenario}-incremental")
        prompt = run_info.model.prompt
        self.tasks, self.blocks, self.components = prompt.tasks, prompt.blocks, prompt.components
        self.classes = run_info.num_classes

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:  # noqa: ARG003
        if cfg.weight_decay != 0:
            raise ConfigError(f"method powder freezes the other tasks' rows by giving them no gradient; weight decay "
                              f"would still shrink them: set weight_decay: 0 (it is {cfg.weight_decay})")
        if cfg.optimizer.state != "fresh":
            raise ConfigError("method powder freezes the other tasks' rows by giving them no gradient; an optimiser "
                              "state kept across rounds would still move them: set optimizer.state: fresh (the "
                              "official code makes a new Adam each round)")
        if cfg.stream.scenario not in ("task", "auto"):
            raise ConfigError(f"method powder runs task-incremental (each input's prompt is composed from its "
                              f"task's row of the task correlation, so the task must be known at test time): set "
                              f"stream.scenario: task (it is {cfg.stream.scenario})")

    # ---- one client's step ----
    def loss(self, ctx: LossContext) -> LossTerms:
        """The task's cross-entropy, and the weighted not-true distillation from the round's global model."""
        ce = F.cross_entropy(ctx.logits, ctx.y, reduction="none")
        if not self.hparams.ntd or "global" not in ctx.server:  # the run's first round: no global model yet
            return LossTerms(task=ce)
        model = self.run_info.model
        with torch.no_grad(), evaluating(model):
            teacher = torch.func.functional_call(model, ctx.server["global"], (ctx.x, ctx.task))
        ntd = not_true_distillation(ctx.logits, teacher, ctx.y, self.hparams.tau)
        rows = ctx.server["class_weight"][ctx.task * self.classes + ctx.y]  # (B, T K)
        weights = batch_softmax_weights(1 - rows.max(1).values, ctx.weight)
        # the engine means a per-sample loss over the real samples: n * w_i gives the code's sum_i w_i ntd_i
        return LossTerms(task=ce + self.hparams.ntd * ctx.weight.sum() * weights * ntd)

    def step_gradient(self, step: Step) -> Params:
        """Only the client's task's rows move; the server's correlation never does."""
        t = step.task[0]
        out = {}
        for k, g in step.grads.items():
            if k in SET_BY_SERVER:
                out[k] = torch.zeros_like(g)
            elif k in ROWS:
                rows = (torch.arange(g.shape[0], device=g.device) == t).to(g.dtype)
                out[k] = g * rows.view(-1, *([1] * (g.dim() - 1)))
            else:
                out[k] = g
        return out

    # ---- the round's uploads ----
    def client_end(self, ctx: ClientEndContext) -> State | None:
        """The client's task's rows, its task's and classes' descriptor sums at the round's global model, and
        whether the round was its first on the task."""
        if ctx.event != "round" or len(ctx.data.y) == 0:
            return None
        t, y = ctx.data.task, ctx.data.y
        started = int(ctx.state.get("task", -1) != t)
        ctx.state["task"] = t
        scores = torch.cat([self._scores(ctx.model, ctx.training.global_params, x)
                            for x in ctx.data.x.split(QUERY_BATCH)]).flatten(1)  # (N, L T C)
        onehot = F.one_hot(y, self.classes).to(scores.dtype)
        return {"task": t, "started": started, "sum": scores.sum(0), "count": len(y), "class_sum": onehot.T @ scores,
                "class_count": onehot.sum(0), "rows": {k: ctx.params[k][t].detach().clone() for k in ROWS}}

    @staticmethod
    def _scores(model: Any, params: Params, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            query = model.query(x)
            keys = torch.einsum("ij,jlcd->ilcd", params["prompt.mixing"], params["prompt.keys"])
            attention = torch.einsum("ij,jlcd->ilcd", params["prompt.mixing"], params["prompt.attention"])
            return component_scores(query, keys, attention)

    def count_bytes(self, ctx: Payload) -> int | None:
        """A round's upload: the descriptors (the rows are the model's, counted with it); the broadcast: ``F``
        (the global model is the round's download); a client keeps its task id only."""
        if ctx.kind == "round_upload":
            return sum(ctx.payload[k].numel() * ctx.payload[k].element_size()
                       for k in ("sum", "class_sum", "class_count"))
        if ctx.kind == "round":
            return ctx.payload["class_weight"].numel() * ctx.payload["class_weight"].element_size()
        return ctx.sizing.num_clients * 64 if ctx.kind == "client_state" else None  # a task id a client

    # ---- the server ----
    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        if ctx.event == "start":
            self._start(ctx.server, ctx.global_params)
            return None
        if not ctx.uploads:
            return None
        server = ctx.server
        sent = list(ctx.uploads.values())
        held = sorted({u["task"] for u in sent})
        trained = server["has"].clone()
        trained[held] = True
        for t in held:
            mine = [u for u in sent if u["task"] == t]
            for k in ROWS:
                server["rows"][k][t] = torch.stack([u["rows"][k] for u in mine]).mean(0)
            mask = trained.view(1, -1, 1).to(server["desc"].dtype)
            total = torch.stack([u["sum"] for u in mine]).sum(0).view(self.blocks, self.tasks, self.components)
            server["desc"][t] = total / sum(u["count"] for u in mine) * mask
            server["desc_trained"][t] = trained
            server["has"][t] = True
            sums = torch.stack([u["class_sum"] for u in mine]).sum(0).view(-1, self.blocks, self.tasks,
                                                                           self.components)
            counts = torch.stack([u["class_count"] for u in mine]).sum(0)
            rows = slice(t * self.classes, (t + 1) * self.classes)
            present = counts > 0
            server["class_desc"][rows][present] = sums[present] / counts[present].view(-1, 1, 1, 1) * mask
            server["class_trained"][rows][present] = trained
            server["class_has"][rows] |= present
        if any(u["started"] for u in sent):
            self._correlate(server)
        change = {**{k: v.clone() for k, v in server["rows"].items()}, "prompt.mixing": server["mixing"].clone(),
                  "prompt.selection": server["selection"].clone()}
        server["global"] = frozen({**ctx.global_params, **change})
        return ServerChange(change)

    def _start(self, server: State, params: Params) -> None:
        t, b, c, k = self.tasks, self.blocks, self.components, self.classes
        dtype = params["prompt.keys"].dtype
        server["rows"] = frozen({name: params[name] for name in ROWS})
        server["mixing"], server["selection"] = torch.eye(t, dtype=dtype), torch.eye(t, dtype=dtype)
        server["desc"], server["desc_trained"] = torch.zeros(t, b, t, c, dtype=dtype), torch.zeros(t, t, dtype=bool)
        server["has"] = torch.zeros(t, dtype=bool)
        server["class_desc"] = torch.zeros(t * k, b, t, c, dtype=dtype)
        server["class_trained"] = torch.zeros(t * k, t, dtype=bool)
        server["class_has"] = torch.zeros(t * k, dtype=bool)
        server["class_weight"] = torch.zeros(t * k, t * k, dtype=dtype)

    def _correlate(self, server: State) -> None:
        """``W``, each task's selection and ``F`` from the latest descriptors."""
        h = self.hparams
        server["mixing"] = task_mixing(server["desc"], server["desc_trained"], server["has"], h.task_power)
        server["selection"] = task_selection(server["mixing"], server["has"], h.top_k)
        task_of = torch.arange(self.tasks).repeat_interleave(self.classes)
        server["class_weight"] = class_weights(server["class_desc"], server["class_trained"], server["class_has"],
                                               task_of, h.class_power, h.class_top_k)
