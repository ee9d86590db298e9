"""DualPrompt (Wang, Zhang, Ebrahimi, Sun, Zhang, Lee, Ren, Su, Perot, Dy, Pfister, ECCV 2022, "DualPrompt:
Complementary Prompting for Rehearsal-free Continual Learning"; official code github.com/google-research/l2p, JAX,
and its PyTorch port github.com/JH-LEE-KR/dualprompt-pytorch), federated by FedAvg over the G-prompt, the
E-prompts, their keys and the head. The model (``model.train: dual-prompts``, cfl/pretrained/dual_prompt.py,
prefix_attention.py and adapted.py): the G-prompt prefixes the attention of the first ``g_prompt_layers`` blocks,
each input's E-prompts that of the next ``e_prompt_layers`` (its task's at training, the code's
``use_prompt_mask``; its query's top-k keys at evaluation), and the head reads the [CLS] output. This file is one
client's loss beyond the cross-entropy: the pull of the input's task's keys towards its query,
``lam * sum_k (1 - cos(query, key_k))`` (the code's ``pull_constraint_coeff`` 1.0, which subtracts
``lam * sum_k cos``: the same gradient), and the server's copy, at each task end, of the finished task's E-prompts
into the next task's (the code's ``shared_prompt_pool``, default True; keys are not copied, ``shared_prompt_key``
False). The cross-entropy's softmax runs over the current task's classes (``class_mask: current``, the code's
``train_mask``). docs/methods/dualprompt.md gives cfl's reading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods.base import Computes, LossContext, LossTerms, Method, Requires, ServerChange, ServerEvent
from cfl.methods.bounds import WEIGHT_MAX
from cfl.methods.class_mask import ClassMasked, class_mask_field
from cfl.methods.declarations import Sends
from cfl.pretrained.dual_prompt import task_prompts


@dataclass(frozen=True)
class DualPromptHyperparams:
    lam: float = field(1.0, "weight of the key-query pull (the official code's pull_constraint_coeff)",
                       min=0, max=WEIGHT_MAX)
    shared_pool: bool = field(True, "at each task end, copy the task's E-prompts into the next task's (the official "
                                    "shared_prompt_pool)")
    class_mask: str = class_mask_field("current")


def pull(query: torch.Tensor, keys: torch.Tensor, task: torch.Tensor, top_k: int) -> torch.Tensor:
    """Per input ``(N,)``: ``sum_k (1 - cos(query, key_k))`` over the keys of its task's E-prompts."""
    chosen = F.normalize(keys, dim=-1, eps=1e-12)[task_prompts(task, top_k)]  # (N, top_k, D)
    return (1 - torch.einsum("nkd,nd->nk", chosen, F.normalize(query, dim=-1, eps=1e-12))).sum(1)


class DualPrompt(ClassMasked, Method):
    name = "dualprompt"
    about = ("DualPrompt: a shared G-prompt and per-task E-prompts as attention prefixes of a frozen pretrained ViT "
             "(Wang et al. 2022), FedAvg of prompts, keys and head; model.train: dual-prompts")
    Hyperparams = DualPromptHyperparams
    requires = Requires(model_train="dual-prompts", schedules=("synchronous",),
                        schedules_why="at each task end the server copies the finished task's E-prompts into the next "
                                      "task's, which is defined when every client moves on together")
    sends = Sends(server_events=("task_end",))
    computes = Computes(losses=("task", "extra"))

    @classmethod
    def check(cls, hparams: Any, cfg: Config) -> None:  # noqa: ARG003
        tasks, m = cfg.stream.num_tasks, cfg.model
        if tasks is not None and m.prompt_pool < tasks * m.prompt_top_k:
            raise ConfigError(f"method dualprompt gives each task its own {m.prompt_top_k} E-prompt(s) "
                              f"(model.prompt_top_k): model.prompt_pool {m.prompt_pool} is fewer than "
                              f"stream.num_tasks {tasks} x {m.prompt_top_k}; raise prompt_pool or lower prompt_top_k "
                              f"(the official code: prompt_top_k 1, prompt_pool the number of tasks)")
        if cfg.weight_decay != 0:
            raise ConfigError(f"method dualprompt trains only the current task's E-prompts, and weight decay would "
                              f"still shrink the others; set weight_decay: 0 (it is {cfg.weight_decay})")

    def loss(self, ctx: LossContext) -> LossTerms:
        if ctx.part == "task":
            return super().loss(ctx)
        model = self.run_info.model
        query = model.query(ctx.x)
        return LossTerms(extra=self.hparams.lam * pull(query, ctx.params["prompt.keys"], ctx.task, model.prompt.top_k))

    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        """At the end of task ``t``: task ``t + 1``'s E-prompts start from task ``t``'s (none after the last)."""
        top_k = self.run_info.model.prompt.top_k
        prompts = ctx.global_params["prompt.prompts"]
        if not self.hparams.shared_pool or (ctx.task + 2) * top_k > prompts.shape[0]:
            return None
        new = prompts.clone()
        new[(ctx.task + 1) * top_k:(ctx.task + 2) * top_k] = prompts[ctx.task * top_k:(ctx.task + 1) * top_k]
        return ServerChange({"prompt.prompts": new})
