"""PILoRA (Guo, Zhu, Wang et al. 2024, "PILoRA: Prototype Guided Incremental LoRA for Federated Class-Incremental
Learning", ECCV 2024; official code github.com/Ghy0501/PILoRA, ``PILoRA-cifar/``; fed-mammoth's
``_models/pilora.py``) on a frozen pretrained ViT: incremental LoRA (each task its own factors on the first block's
query and value projections: ``model.lora_tasks: per-task``, cfl/pretrained/task_lora.py) and a prototype classifier
(``model.classifier: prototype``: logits ``-d_k``, ``d_k = sqrt(|f - c_k|^2 / D)``, cfl/pretrained/prototype_head.py).

One client's loss (the official ``update_weights`` and ``CPN.DCE``): the distance-based cross-entropy
``CE(-d / T, y)`` plus ``pl * d_y`` (the prototype loss, 0.001), plus ``l1 * (|A_q,t|_1 + |A_v,t|_1)`` of the current
task's ``A`` factors (0.01) and, from the second task, ``ortho * sum_{s<t} (sum|A_q,s A_q,t^T| + sum|A_v,s A_v,t^T|)``
(0.5): the current ``A`` kept off the earlier tasks'. A step moves the current task's factors and its classes'
centres only (the official ``requires_grad`` of ``linear_*_{t}`` and ``centers_initial``).

The server (the official ``average_weights`` and ``compute_weight``): the factors by the sample-weighted mean; each
class ``c`` of the task by **prototype re-weighting**: client ``i``'s centre ``c_i`` weighted by
``softmax(n_i / 0.2)``, ``n`` the min-max normalised reciprocals of ``sum_j |c_i - mu_j|``, ``mu_j`` the mean
feature of class ``c`` on client ``j`` (the clients holding it): a centre close to every client's class mean
counts more. Each client sends its classes' feature sums and counts with its model (``client_end("round")``).

cfl's reading: the class means are of the client's data at its trained model, after its steps (the official code
averages the features of its training batches as they pass, over all local epochs at the moving model; fed-mammoth
keeps that form, and its commented-out alternative is cfl's); the model trains and is evaluated on
``W + sum_t B_t A_t`` of the tasks so far (the paper's merge and fed-mammoth's forward; the official code trains on
the current task's factors alone and evaluates a merge ``(A_0 + A_t)``, ``(B_0 + B_t)`` of the first and current
tasks only, which cfl does not offer); with a single client holding a class (min equal to max) the weights are
uniform (the official normalisation divides by zero there); a class no client holds keeps its mean centre; the
learning rates of the centres and the factors are set by ``lr_groups`` (the official Adam: centres 2e-3 in its
scripts, factors 1e-5); no weight decay (the official 1e-5 on the current task's parameters: cfl's frozen tasks
would decay too) and no cosine decay of the learning rates over a task's rounds (the official schedule).
``class_mask``: the softmax runs over every class's centre (``all``, the official code's: later tasks' centres at
their initial draw), the classes seen so far (``seen``) or the sample's task's (``current``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

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
from cfl.ops.losses import current_task_cross_entropy, masked_cross_entropy, task_class_table
from cfl.pretrained.module_inputs import visit_module_inputs
from cfl.pretrained.task_lora import TaskLoRALinear

CENTERS = "head.centers"
#: added to the summed distances before the reciprocal (fed-mammoth's eps; the official code has none: a centre on
#: the class mean would divide by zero)
EPS = 1e-10
#: samples per forward when a client computes its class means
FEATURE_BATCH = 128


@dataclass(frozen=True)
class PILoRAHyperparams:
    l1: float = field(0.01, "weight of the L1 norm of the current task's A factors (the official 0.01)", min=0,
                      max=WEIGHT_MAX)
    ortho: float = field(0.5, "weight of sum |A_s A_t^T| between the current task's A and every earlier task's "
                         "(the official 0.5)", min=0, max=WEIGHT_MAX)
    pl: float = field(0.001, "weight of the prototype loss, the distance to the sample's own class centre (the "
                      "official 0.001)", min=0, max=WEIGHT_MAX)
    temperature: float = field(1.0, "T of the distance-based cross-entropy CE(-d / T) (the official 1)", gt=0,
                               max=1e6)
    reweight: str = field("prototype", "how the server merges the task's class centres: prototype (each client's "
                          "weighted by its closeness to the clients' class means: the official) or mean (FedAvg)",
                          choices=("prototype", "mean"))
    reweight_temperature: float = field(0.2, "prototype: the softmax temperature of the normalised closeness (the "
                                        "official 0.2)", gt=0, max=1e6)
    class_mask: str = field("all", "classes the cross-entropy's softmax runs over: all (every class's centre, the "
                            "official), seen (the classes seen so far) or current (the sample's task's)",
                            choices=("all", "seen", "current"))


class PILoRA(Method):
    name = "pilora"
    about = ("PILoRA: per-task LoRA on a frozen pretrained ViT with L1 and orthogonality penalties, a prototype "
             "classifier trained by the distance-based cross-entropy, prototype re-weighting at the server (Guo et "
             "al. 2024); model.train: lora, lora_tasks: per-task, classifier: prototype")
    Hyperparams = PILoRAHyperparams
    requires = Requires(model_train="lora", schedules=("synchronous",),
                        schedules_why="the server re-weights the centres of the round's task, which every client "
                                      "trains at once")
    sends = Sends(server_events=("round",), client_events=("round",))
    computes = Computes(losses=("task", "extra"))

    def __init__(self, hparams: Any, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        model = run_info.model
        self.layers = [n for n, m in model.named_modules() if isinstance(m, TaskLoRALinear)]
        centers = model.head.centers
        self.multi = centers.dim() == 3
        #: each centre row's task (class-incremental or domain: the class's task; one head per task: every row)
        self.owner = None if self.multi else _class_tasks(run_info.task_classes, centers.shape[0])

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:  # noqa: ARG003
        m = cfg.model
        if m.lora_tasks != "per-task" or m.classifier != "prototype":
            raise ConfigError("method pilora trains each task's own LoRA factors and a prototype classifier: set "
                              "model.lora_tasks: per-task and model.classifier: prototype (the official code also "
                              "adapts the first block's query and value only: model.lora_targets: qv, lora_layers: 1)")
        if cfg.weight_decay != 0:
            raise ConfigError(f"method pilora freezes the earlier tasks' factors and centres by giving them no "
                              f"gradient; weight decay would still shrink them: set weight_decay: 0 (it is "
                              f"{cfg.weight_decay})")
        if cfg.optimizer.state != "fresh":
            raise ConfigError("method pilora freezes the earlier tasks' factors and centres by giving them no "
                              "gradient; an optimiser state kept across rounds would still move them: set "
                              "optimizer.state: fresh (the official code makes a new Adam each round)")

    # ---- one client's step ----
    def loss(self, ctx: LossContext) -> LossTerms:
        if ctx.part == "task":
            return LossTerms(task=self._distance_loss(ctx))
        penalty = ctx.x.new_zeros(())
        t = ctx.task[0]
        for layer in self.layers:
            a = ctx.params[f"{layer}.lora_a"]  # (tasks, parts, r, in)
            tasks = torch.arange(a.shape[0], device=a.device)
            mine = (tasks == t).to(a.dtype)
            before = (tasks < t).to(a.dtype)
            penalty = penalty + self.hparams.l1 * (mine * a.abs().sum((1, 2, 3))).sum()
            if self.hparams.ortho:
                current = (mine.view(-1, 1, 1, 1) * a).sum(0)  # (parts, r, in)
                pairs = torch.einsum("spri,pki->sprk", a, current).abs().sum((1, 2, 3))  # (tasks,)
                penalty = penalty + self.hparams.ortho * (before * pairs).sum()
        return LossTerms(extra=penalty * ctx.x.new_ones(ctx.x.shape[0]))

    def _distance_loss(self, ctx: LossContext) -> torch.Tensor:
        """``CE(-d / T) + pl * d_y`` per sample (the logits are ``-d``)."""
        z, y, temp = ctx.logits, ctx.y, self.hparams.temperature
        mask = self.hparams.class_mask
        if mask == "current" and self.run_info.scenario == "class":
            table = task_class_table(self.run_info.task_classes, z.shape[-1])
            ce = current_task_cross_entropy(z / temp, y, ctx.task, ctx.weight, table)
        else:
            ce = masked_cross_entropy(z / temp, y, ctx.allowed if mask == "seen" else None)
        own = -z.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        return ce + self.hparams.pl * own

    def step_gradient(self, step: Step) -> Params:
        """Only the current task's factors and its classes' centres move."""
        t = step.task[0]
        out = {}
        for k, g in step.grads.items():
            if k.endswith((".lora_a", ".lora_b")) or (k == CENTERS and self.multi):
                rows = torch.arange(g.shape[0], device=g.device) == t
            elif k == CENTERS:
                rows = self.owner.to(g.device) == t
            else:
                out[k] = g
                continue
            out[k] = g * rows.to(g.dtype).view(-1, *([1] * (g.dim() - 1)))
        return out

    # ---- the round's uploads and the server's centres ----
    def client_end(self, ctx: ClientEndContext) -> State | None:
        if len(ctx.data.y) == 0:
            return None
        sums, counts = class_feature_sums(ctx.model, ctx.params, ctx.data.x, ctx.data.y, ctx.data.task)
        centers = ctx.params[CENTERS]
        centers = centers[ctx.data.task] if self.multi else centers
        return {"sums": sums, "counts": counts, "centers": centers.detach().clone()}

    def count_bytes(self, ctx: Payload) -> int | None:
        if ctx.kind == "client_state":
            return 0
        if ctx.kind != "round_upload":
            return None
        return sum(ctx.payload[k].numel() * ctx.payload[k].element_size() for k in ("sums", "counts"))

    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        if self.hparams.reweight == "mean" or not ctx.uploads:
            return None
        sent = list(ctx.uploads.values())
        merged = ctx.global_params[CENTERS].clone()
        rows = merged[ctx.task] if self.multi else merged
        for c in self._task_rows(ctx.task):
            new = reweighted_center(torch.stack([u["centers"][c] for u in sent]),
                                    [u["sums"][c] / u["counts"][c] for u in sent if u["counts"][c] > 0],
                                    self.hparams.reweight_temperature)
            if new is not None:
                rows[c] = new.to(rows.dtype)
        return ServerChange({CENTERS: merged})

    def _task_rows(self, task: int) -> list[int]:
        if self.multi:
            return list(range(self.run_info.model.head.centers.shape[1]))
        return [int(c) for c in (self.owner == task).nonzero().flatten()]


def _class_tasks(task_classes: tuple[tuple[int, ...], ...], num_classes: int) -> torch.Tensor:
    """Each of ``num_classes`` head rows' task (-1 for a row no task holds)."""
    owner = torch.full((num_classes,), -1, dtype=torch.long)
    for t, classes in enumerate(task_classes):
        owner[list(classes)] = t
    return owner


def reweighted_center(centers: torch.Tensor, means: list[torch.Tensor], temperature: float) -> torch.Tensor | None:
    """PILoRA's merged centre of one class (the official ``compute_weight``): ``centers`` ``(n, D)`` the clients',
    ``means`` the class's mean feature on each client holding it; None when none does. In float64; ``EPS`` added
    to the distances (fed-mammoth's)."""
    if not means:
        return None
    c = centers.to(torch.float64)
    mu = torch.stack(means).to(torch.float64)
    reciprocal = 1 / (torch.cdist(c, mu).sum(1) + EPS)  # 1 / sum_j |c_i - mu_j|
    spread = reciprocal.max() - reciprocal.min()
    if spread == 0:  # one client, or equal closeness: the official 0 / 0; uniform weights
        weights = torch.full_like(reciprocal, 1 / len(reciprocal))
    else:
        weights = torch.softmax((reciprocal - reciprocal.min()) / spread / temperature, 0)
    return (weights.unsqueeze(1) * c).sum(0)


def class_feature_sums(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                       task: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class, the sum of the head's input features of ``x`` at ``params`` ``(K, D)`` and the count ``(K,)``."""
    seen: list[torch.Tensor] = []
    visit_module_inputs(model, params, x, task, ["head"], lambda _name, inputs: seen.append(inputs), FEATURE_BATCH)
    features = torch.cat(seen)
    classes = params[CENTERS].shape[-2]
    onehot = torch.nn.functional.one_hot(y, classes).to(features.dtype)
    return onehot.T @ features, onehot.sum(0)
