"""Classifiers set in closed form from the clients' statistics of frozen features (fedncm, afcl): nothing trains by
SGD. How the round loop treats them: every parameter is frozen (``frozen_params``), so a client's local epochs are
forward passes only (its ``train_loss`` is the current classifier's) and its model comes back unchanged; it sends no
parameters (``client_upload`` names them all at 0 bytes and the server keeps their global values); in
``client_end("round")`` it uploads its statistics of the task once, at its first sampled round of the task
(counted as upload bytes); ``server_end`` adds them to the server's running sums and ``after_server_step`` sets the
head from them, so evaluation at the task's end sees every statistic uploaded by then.

The statistics are kept per head: one slot per task with one head per task (task-incremental), else one slot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from cfl.methods.base import ClientEndContext, Event, Method, Params, State

UNREAD = "a closed-form classifier takes no gradient step (its parameters are frozen: docs/pretrained.md)"


class ClosedFormHead(Method, ABC):
    """The shared mechanics; a subclass gives ``statistics`` (one client's upload) and ``solve`` (the head)."""

    unread_keys: ClassVar[dict[str, str]] = {"lr": UNREAD, "momentum": UNREAD, "weight_decay": UNREAD,
                                             "server_lr": UNREAD}
    client_events: ClassVar[tuple[Event, ...]] = ("round",)
    downloads_model_at_task_end: ClassVar[bool] = False
    schedules: ClassVar[tuple[str, ...]] = ("synchronous",)
    schedules_why: ClassVar[str] = ("after each round it solves the head of the server's one current task from the "
                                     "statistics uploaded so far")
    backbone_only: ClassVar[bool] = True  # refused on any other model by cfl.cross_checks.model_family_error
    model_train: ClassVar[str] = "head"  # on the cached features

    def __init__(self, hparams: Any, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        head = run_info.model.head
        self.multi = head.weight.dim() == 3
        self.classes, self.width = head.weight.shape[-2:]
        self.slots = run_info.num_tasks if self.multi else 1

    def frozen_params(self, names: list[str]) -> list[str]:
        return list(names)

    def client_upload(self, params: Params, state: State) -> tuple[Params, Params]:
        return dict(params), {}  # unchanged (frozen) and not sent: 0 bytes, the server keeps its values

    def upload_bytes(self, sent: Params, info: Params) -> int:
        return 0

    def server_aggregate(self, sent: Params, info: Params) -> Params:
        return {k: v[0] for k, v in sent.items()}  # every client's is the global value

    def slot(self, task: int) -> int:
        return task if self.multi else 0

    def client_end(self, ctx: ClientEndContext) -> State | None:
        data, state = ctx.data, ctx.state
        if "task" in state and int(state["task"]) == data.task:
            return None  # this task's statistics are sent already
        state["task"] = torch.tensor(data.task)
        x = data.x.to(torch.float64)
        onehot = torch.nn.functional.one_hot(data.y, self.classes).to(torch.float64)
        return {**self.statistics(x, onehot), "slot": torch.tensor(self.slot(data.task))}

    def client_state_bytes(self, sizing: Any) -> int | None:
        return sizing.num_clients * 8  # the task each client last sent statistics for: one int64

    def payload_bytes(self, event: str, payload: State) -> int | None:
        if event != "round_upload":
            return None
        return sum(v.numel() * v.element_size() for k, v in payload.items() if k != "slot")  # the slot: the task

    def server_end(self, event: Event, uploads: dict[int, State], server: State, task: int) -> None:
        for upload in uploads.values():
            s = int(upload["slot"])
            for key, value in upload.items():
                if key == "slot":
                    continue
                if key not in server:
                    server[key] = torch.zeros(self.slots, *value.shape, dtype=value.dtype, device=value.device)
                server[key][s] += value

    def after_server_step(self, model: nn.Module, global_params: Params, server: State, task: int) -> Params | None:
        if not any(k in server for k in self.statistic_keys):
            return None
        weight, bias = global_params["head.weight"], global_params["head.bias"]
        new_w, new_b = weight.clone(), bias.clone()
        for s in range(self.slots):
            solved = self.solve(server, s)
            if solved is None:
                continue
            w, b = solved
            if self.multi:
                new_w[s], new_b[s] = w.to(weight.dtype), b.to(bias.dtype)
            else:
                new_w, new_b = w.to(weight.dtype), b.to(bias.dtype)
        return {"head.weight": new_w, "head.bias": new_b}

    statistic_keys: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def statistics(self, x: torch.Tensor, onehot: torch.Tensor) -> State:
        """One client's upload from its features ``x`` ``(N, D)`` and one-hot labels ``(N, K)``, float64."""

    @abstractmethod
    def solve(self, server: State, slot: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The head ``(weight (K, D), bias (K,))`` of ``slot`` from the server's sums; None: no data yet."""
