"""LoRM (Salami, Bertoni, Cucchiara, Porrello et al., ICLR 2025, "Closed-form merging of parameter-efficient
modules for federated continual learning"; official code: github.com/aimagelab/fed-mammoth, ``_models/lorm.py``):
LoRA on a frozen pretrained ViT where each round trains only one of the two factors (``B`` in a task's first
round, then ``A``, then ``B``, ...: the official ``train_matrix: alt``, restarting at ``B`` at each task), so
that the server can merge the trained factor **in closed form** instead of averaging it: RegMean on the clients'
Gram matrices of the layer inputs, solved in float64 (cfl/pretrained/regmean.py). With the other factor shared,
the merged ``B A`` is the one that best reproduces every client's LoRA outputs on its own inputs. The head merges
the same way (RegMean of its weight on the Grams of its inputs); its bias is FedAvg'd (weighted by samples, as
the official code).

Per round a client uploads its trained factor and head (the model upload) and, from ``client_end("round")``, the
Gram matrices of its data at its trained model: of each LoRA layer's input (``in x in`` when ``A`` trained,
projected onto the shared ``A`` to ``r x r`` when ``B`` trained: the same merge, ``A G A^T``), and of the head's
input; the Grams are counted in the upload bytes (``count_bytes``), the factor and head copies they travel with
are the model upload's values, counted there.

At each task end (synchronous schedule only) the task's LoRA update merges into the shared frozen backbone
(``server_event("task_end")``), as the official ``end_task_server``: the task-end participants send the Grams ``G_i`` of
each LoRA layer's input at the task's final model, the server sums them into the task's ``G_t`` and merges the
tasks' weight changes by RegMean over the tasks, ``Delta_t = (sum_s D_s G_s)(sum_s G_s)^+`` (float64, the sums
kept in the server state), the backbone becomes ``W0 + Delta_t``, and the factors restart (``A`` Kaiming-uniform,
``B`` zero, the official ``init_matrices``).

cfl's reading: the official code trains each task on ``W0 + B_t A_t`` and evaluates on the merge; cfl has one model
for training and evaluation, so a task trains on the merged backbone ``W0 + Delta_{t-1}`` plus its factors and the
task's weight change is ``D_t = Delta_{t-1} + (alpha / r) B_t A_t``; LoRA on ``qkv`` only (cfl's
``model.train: lora``; the official code also adapts the MLP and the attention's output projection); Grams
computed and sent in float64 (the official code's default is float32); the frozen factor gets no gradient (so
``weight_decay`` and a kept optimiser state, which would still move it, are refused). The cross-entropy's softmax
runs over the current task's classes only (``class_mask: current``, the official ``observe``'s
``outputs[:, cur_offset:cur_offset + cpt]``); ``seen``: every class seen so far."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods.base import ClientEndContext, Method, Params, Payload, ServerChange, ServerEvent, State
from cfl.methods.class_mask import ClassMasked, class_mask_field
from cfl.methods.declarations import Requires, Sends
from cfl.methods.hook_types import BackboneUpdate, ClientData, Step
from cfl.pretrained.lora import LoRALinear
from cfl.pretrained.module_inputs import visit_module_inputs
from cfl.pretrained.regmean import projected_gram, regmean, shrunk

#: the server-state flag broadcast each round: 1 when the round trains every ``B``, 0 when it trains every ``A``
TRAIN_B = "train_b"
#: samples per forward when a client computes its Grams
GRAM_BATCH = 128


@dataclass(frozen=True)
class LoRMHyperparams:
    alpha: float = field(0.5, "RegMean's Gram regularisation: off-diagonal entries scaled by alpha, the diagonal "
                         "kept (1: the plain Gram; the official alpha_regmean_head/backbone, 0.5)", gt=0, max=1)
    alpha_backbone: Optional[float] = field(None, "alpha of the LoRA layers' Grams alone, the head's staying alpha "
                                            "(null: alpha, the official code's default; 0: their diagonals only, "
                                            "as the official README's LoRM lines, alpha_regmean_backbone=0)",
                                            min=0, max=1)
    class_mask: str = class_mask_field("current")


class LoRM(ClassMasked, Method):
    name = "lorm"
    about = ("LoRM: LoRA on a frozen pretrained ViT, one factor trained per round and merged in closed form "
             "(RegMean on the clients' Grams, float64; Salami et al. 2025), each task merged into the backbone at "
             "its end; model.train: lora")
    Hyperparams = LoRMHyperparams
    requires = Requires(model_train="lora", schedules=("synchronous",),
                        schedules_why="at each task end it merges the task's LoRA update into the backbone that "
                                      "every client runs, and under the other schedules clients hold different tasks")
    sends = Sends(server_events=("start", "round", "task_end"), changes_backbone=True, broadcast={"round": (TRAIN_B,)},
                  client_events=("round", "task_end"))

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:  # noqa: ARG003
        m = cfg.model
        if (m.lora_targets, m.lora_tasks, m.classifier) != ("qkv", "shared", "linear"):
            raise ConfigError("method lorm merges one LoRA pair of each whole qkv projection and a linear head: set "
                              "model.lora_targets: qkv, lora_tasks: shared and classifier: linear (the defaults)")
        if cfg.weight_decay != 0:
            raise ConfigError(f"method lorm freezes one LoRA factor each round by giving it no gradient; weight decay "
                              f"would still shrink it: set weight_decay: 0 (it is {cfg.weight_decay})")
        if cfg.optimizer.state != "fresh":
            raise ConfigError("method lorm freezes one LoRA factor each round by giving it no gradient; an optimiser "
                              "state kept from the previous round would still move it: set optimizer.state: fresh")

    @property
    def backbone_alpha(self) -> float:
        """The regularisation of the LoRA layers' Grams: ``alpha_backbone``, else ``alpha``."""
        h = self.hparams
        return h.alpha if h.alpha_backbone is None else h.alpha_backbone

    def step_gradient(self, step: Step) -> Params | None:
        train_b = step.server[TRAIN_B]
        return {k: g * train_b if k.endswith(".lora_b") else g * (1 - train_b) if k.endswith(".lora_a") else g
                for k, g in step.grads.items()}

    def client_end(self, ctx: ClientEndContext) -> State | None:
        event, model, params, data, server = ctx.event, ctx.model, ctx.params, ctx.data, ctx.server
        if len(data.y) == 0:
            return None  # no samples, no Gram: left out of the merge
        layers = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
        if event == "task_end":  # the Grams of the LoRA layers' inputs at the task's final model (task merge)
            grams = input_grams(model, params, data, layers)
            return {"task_grams": {layer: shrunk(grams[layer], self.backbone_alpha) for layer in layers}}
        grams = input_grams(model, params, data, [*layers, "head"])
        train_b = bool(server[TRAIN_B])
        factor = "lora_b" if train_b else "lora_a"
        upload: State = {"factors": {}, "grams": {}}
        for layer in layers:
            gram = shrunk(grams[layer], self.backbone_alpha)
            upload["factors"][layer] = params[f"{layer}.{factor}"].detach().clone()
            upload["grams"][layer] = projected_gram(gram, params[f"{layer}.lora_a"]) if train_b else gram
        upload["head_weight"] = params["head.weight"].detach().clone()
        upload["head_gram"] = shrunk(grams["head"], self.hparams.alpha)
        return upload

    def count_bytes(self, ctx: Payload) -> int | None:
        if ctx.kind == "client_state":
            return 0  # the Grams are sent at once, nothing is kept
        if ctx.kind != "round_upload":
            return None
        grams = [*ctx.payload["grams"].values(), ctx.payload["head_gram"]]  # the factor and head: the model upload's
        return sum(g.numel() * g.element_size() for g in grams)

    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        server, uploads, task = ctx.server, ctx.uploads, ctx.task
        if ctx.event == "start":
            server[TRAIN_B] = torch.tensor(1.0)
            return None
        if ctx.event == "task_end":
            server[TRAIN_B] = torch.ones_like(server[TRAIN_B])  # each task starts by training B (begin_task)
            sent = [u["task_grams"] for u in uploads.values()]
            if not sent:
                raise ValueError(f"no client sent the Grams of task {task} (all task-end participants had no "
                                 "samples): the task's LoRA update cannot be merged")
            task_gram = {layer: sum_of([g[layer] for g in sent]) for layer in sent[0]}
            return ServerChange(backbone=self.task_merge(ctx.model, ctx.global_params, server, task_gram, task))
        merged = None
        if uploads:
            factor = "lora_b" if bool(server[TRAIN_B]) else "lora_a"
            sent = list(uploads.values())
            merged = {f"{layer}.{factor}": regmean([u["factors"][layer] for u in sent],
                                                   [u["grams"][layer] for u in sent]) for layer in sent[0]["factors"]}
            merged["head.weight"] = regmean([u["head_weight"] for u in sent], [u["head_gram"] for u in sent])
        server[TRAIN_B] = 1 - server[TRAIN_B]  # the next round trains the other factor
        if merged is None:
            return None
        return ServerChange({k: v.to(ctx.global_params[k].dtype) for k, v in merged.items()})

    def task_merge(self, model: nn.Module, global_params: Params, server: State, task_gram: dict[str, torch.Tensor],
                   task: int) -> BackboneUpdate:
        """The task's LoRA update merged into the backbone by RegMean over the tasks (the official
        ``end_task_server``), and the factors re-initialised (the official ``init_matrices``)."""
        merge = server.setdefault("task_merge", {"weighted": {}, "gram": {}})
        modules = dict(model.named_modules())
        gen = torch.Generator().manual_seed(int(self.run_info.seed) * 10_007 + 7_919 * (task + 1))
        deltas, params = {}, {}
        for layer, gram in task_gram.items():
            lora = modules[layer]
            a, b = global_params[f"{layer}.lora_a"], global_params[f"{layer}.lora_b"]
            before = merged_delta(merge["weighted"].get(layer), merge["gram"].get(layer), b.shape[0], a.shape[1])
            change = before + lora.scale * b.to(torch.float64) @ a.to(torch.float64)  # D_t, from W0
            weighted, total = change @ gram, gram
            if layer in merge["gram"]:
                weighted, total = merge["weighted"][layer] + weighted, merge["gram"][layer] + total
            merge["weighted"][layer], merge["gram"][layer] = weighted, total
            deltas[f"{layer}.weight"] = merged_delta(weighted, total, b.shape[0], a.shape[1]) - before
            fresh = torch.empty_like(a)
            nn.init.kaiming_uniform_(fresh, a=math.sqrt(5), generator=gen)
            params[f"{layer}.lora_a"], params[f"{layer}.lora_b"] = fresh, torch.zeros_like(b)
        return BackboneUpdate(deltas, params)


def sum_of(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of ``tensors``, one at a time, in float64."""
    total = tensors[0].to(torch.float64).clone()
    for t in tensors[1:]:
        total += t.to(torch.float64)
    return total


def merged_delta(weighted: torch.Tensor | None, gram: torch.Tensor | None, out: int, inp: int) -> torch.Tensor:
    """RegMean's merged weight change over the finished tasks, ``(sum_s D_s G_s)(sum_s G_s)^+`` (float64); zero
    before the first task end."""
    if weighted is None or gram is None:
        return torch.zeros(out, inp, dtype=torch.float64)
    return weighted @ torch.linalg.pinv(gram, hermitian=True)


def input_grams(model: nn.Module, params: Params, data: ClientData, names: list[str]) -> dict[str, torch.Tensor]:
    """``X^T X`` (float64) of the inputs of each submodule of ``names`` over the client's samples, at ``params``
    (every token of a batch is a row: a ViT layer sees ``samples x tokens`` inputs)."""
    grams: dict[str, torch.Tensor] = {}

    def add(name: str, inputs: torch.Tensor) -> None:
        x = inputs.reshape(-1, inputs.shape[-1]).to(torch.float64)
        grams[name] = grams[name] + x.T @ x if name in grams else x.T @ x

    visit_module_inputs(model, params, data.x, data.task, names, add, GRAM_BATCH)
    return grams
