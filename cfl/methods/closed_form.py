"""Classifiers set in closed form from the clients' statistics of a frozen backbone's cached features (fedncm,
afcl, ranpac, and plugins: docs/plugins.md, "A classifier in closed form"): nothing trains by SGD. A subclass gives
two functions, ``statistics`` (one client's upload from its features and one-hot labels, float64) and ``solve``
(a head from the server's sums); a fixed projection before the head is ``run_info.model.project(W)`` in its
``__init__``, before this class's (ranpac).

How the round loop treats them: every parameter is frozen (``param_roles``' ``frozen``), so a client's local
epochs are forward passes only (its ``train_loss`` is the current classifier's, on the sequential trainer) and its
model comes back unchanged; it sends no parameters (``client_upload`` names them all at 0 bytes and the server
keeps their global values); in ``client_end("round")`` it uploads its statistics of the task once, at its first
sampled round of the task (counted as upload bytes); ``server_event("round")`` adds them to the server's running
sums and sets the heads whose sums changed from them, so evaluation at the task's end sees every statistic uploaded
by then. ``lr``, ``momentum``, ``weight_decay`` and ``server_lr`` are refused when set (nothing reads them).

The statistics are kept per head: one slot per task with one head per task (task-incremental), else one slot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from cfl.methods.base import ClientEndContext, Method, Params, ServerChange, ServerEvent, State
from cfl.methods.declarations import Computes, Requires, Sends
from cfl.methods.traffic_hooks import ParamNames, ParamRoles, Payload, StackedUploads, TrainedClient

UNREAD = "a closed-form classifier takes no gradient step (its parameters are frozen: docs/pretrained.md)"


class ClosedFormHead(Method, ABC):
    """The shared mechanics; a subclass gives ``statistics`` (one client's upload) and ``solve`` (the head)."""

    requires = Requires(  # model_train head: on a backbone's cached features (cfl.cross_checks.model_family_error)
        model_train="head", unread_keys={"lr": UNREAD, "lr_groups": UNREAD, "momentum": UNREAD, "weight_decay": UNREAD,
                                         "server_lr": UNREAD},
        schedules=("synchronous",),
        schedules_why="after each round it solves the head of the server's one current task from the statistics "
                      "uploaded so far")
    sends = Sends(server_events=("round",), client_events=("round",), downloads_model_at_task_end=False)
    computes = Computes(sequential_reason="a classifier set in closed form: every parameter is frozen, so a "
                                          "client's local epochs are forward passes only (its train loss), one client "
                                          "after another")

    def __init__(self, hparams: Any, run_info: Any) -> None:
        super().__init__(hparams, run_info)
        head = run_info.model.head
        self.multi = head.weight.dim() == 3
        self.classes, self.width = head.weight.shape[-2:]
        self.slots = run_info.num_tasks if self.multi else 1

    def param_roles(self, ctx: ParamNames) -> ParamRoles:
        return ParamRoles(frozen=list(ctx.names))

    def client_upload(self, ctx: TrainedClient) -> tuple[Params, Params]:
        return dict(ctx.params), {}  # unchanged (frozen) and not sent: 0 bytes, the server keeps its values

    def server_aggregate(self, ctx: StackedUploads) -> Params:
        return {k: v[0] for k, v in ctx.sent.items()}  # every client's is the global value

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

    def count_bytes(self, ctx: Payload) -> int | None:
        if ctx.kind == "client_upload":
            return 0
        if ctx.kind == "client_state":
            return ctx.sizing.num_clients * 8  # the task each client last sent statistics for: one int64
        if ctx.kind != "round_upload":
            return None
        return sum(v.numel() * v.element_size() for k, v in ctx.payload.items() if k != "slot")  # the slot: the task

    def server_event(self, ctx: ServerEvent) -> ServerChange | None:
        server, global_params = ctx.server, ctx.global_params
        updated: set[int] = set()
        for upload in ctx.uploads.values():
            s = int(upload["slot"])
            updated.add(s)
            for key, value in upload.items():
                if key == "slot":
                    continue
                if key not in server:
                    server[key] = torch.zeros(self.slots, *value.shape, dtype=value.dtype, device=value.device)
                server[key][s] += value
        if not updated:  # no new statistics: every head is as its last solve left it (frozen, never averaged)
            return None
        weight, bias = global_params["head.weight"], global_params["head.bias"]
        new_w, new_b = weight.clone(), bias.clone()
        for s in sorted(updated):  # the slots whose sums changed (an M x M solve each: ranpac)
            solved = self.solve(server, s)
            if solved is None:
                continue
            w, b = solved
            if self.multi:
                new_w[s], new_b[s] = w.to(weight.dtype), b.to(bias.dtype)
            else:
                new_w, new_b = w.to(weight.dtype), b.to(bias.dtype)
        return ServerChange({"head.weight": new_w, "head.bias": new_b})

    @abstractmethod
    def statistics(self, x: torch.Tensor, onehot: torch.Tensor) -> State:
        """One client's upload from its features ``x`` ``(N, D)`` and one-hot labels ``(N, K)``, float64."""

    @abstractmethod
    def solve(self, server: State, slot: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The head ``(weight (K, D), bias (K,))`` of ``slot`` from the server's sums; None: no data yet."""
