"""Which training path the engine takes for a run, and why: decided once, printed once, kept in results.

``stacked``: stacked tensor operations with each linear layer's optimiser step taken in its backward
(:mod:`cfl.engine.local.stacked_net`), for models that list their layers, every local optimiser (plain SGD fused
into the weight-gradient product; momentum, Adam and AdamW from the materialised gradient) and methods whose
hooks have a fused form, at one learning rate (no ``lr_groups``). ``vmap``: autograd under ``torch.func.vmap``
over one-client code, for every model and method. ``sequential``: one client after another (``client_execution:
sequential``, a method that declares a ``sequential_reason`` or keeps parameters per client (``param_roles`` and
its kin), step hooks on a model whose layers mix samples, where ``vmap`` would pad them, or an extra loss on a
model with BatchNorm running statistics, whose forwards inside it would update them in place; a step draw read
only by the extra loss is not padded there: those losses run per group of clients with equal counts).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from torch import nn

from cfl.engine.hook_call import takes
from cfl.engine.local import local_optim
from cfl.engine.local.jobs import Hyper
from cfl.engine.local.stacked_net import StackedNet
from cfl.engine.local.stacking import couples_samples
from cfl.engine.local.step_hooks import STEP_HOOKS
from cfl.methods.base import Method, per_client_hooks
from cfl.methods.declarations import HOOK_PARTS, gives
from cfl.models.buffers import keeps_running_stats

_STEP = "a step hook, which needs each client's materialised gradient"
#: what the stacked path cannot take (a declared part, ``hook.part``, or a hook overridden), with the reason
_NOT_STACKED = {
    "loss.extra": "which needs per-sample losses",
    "loss.task": "which replaces the cross-entropy the fused step differentiates",
    "round_terms.projection": "whose projection the fused step does not apply",
    **{hook: _STEP for hook in STEP_HOOKS},
}


def _what(key: str) -> str:
    """``declares losses 'extra'`` for a part (``loss.extra``), ``overrides step_gradient`` for a hook."""
    hook, _, part = key.partition(".")
    return f"declares {HOOK_PARTS[hook][0]} '{part}'" if part else f"overrides {hook}"


@dataclass(frozen=True)
class EnginePath:
    path: str  # "stacked" | "vmap" | "sequential"
    reason: str

    def line(self) -> str:
        """The log line: ``engine: stacked path``, else e.g. ``engine: vmap path (reason: ...)``."""
        if self.path == "stacked":
            return "engine: stacked path"
        return f"engine: {self.path} path (reason: {self.reason})"

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}

    def announce(self) -> None:
        print(self.line(), file=sys.stderr)


def stacked_refusal(model: nn.Module, hp: Hyper, methods: list[Method]) -> str | None:
    """Why the stacked path cannot train this run, or None when it can."""
    for m in methods:
        for key, why in _NOT_STACKED.items():
            if takes(m, key):
                return f"method {m.name} {_what(key)}, {why}"
    preconditioning = [m.name for m in methods if gives(m, "preconditioner")]
    penalising = [m.name for m in methods if gives(m, "penalty")]
    if preconditioning and penalising:
        return (f"method {preconditioning[0]} preconditions the gradients and method {penalising[0]} adds a penalty, "
                "whose fused step would not be preconditioned")
    if local_optim.plain_sgd(hp) and any(gives(m, "penalty") for m in methods) and hp.lr * hp.weight_decay == 1.0:
        return "lr * weight_decay = 1: the penalty's fused pre-step would divide by 1 - lr * weight_decay"
    refusal = StackedNet.model_refusal(model)
    if refusal is None and hp.lr_groups:
        return "lr_groups gives parameters their own learning rates, which the fused step does not apply"
    return refusal


def sequential_refusal(model: nn.Module, methods: list[Method]) -> str | None:
    """Why the run must train one client after another whatever ``client_execution`` says, or None."""
    for m in methods:
        if m.computes.sequential_reason:
            return f"method {m.name}: {m.computes.sequential_reason}"
    for m in methods:
        hooks = per_client_hooks(type(m))
        if hooks:
            return (f"method {m.name} keeps parameters per client ({', '.join(hooks)}): only the sequential trainer "
                    f"starts each client from its own parameters (the batched paths start every client of a stack "
                    f"from the global model)")
    # a step draw that only the extra loss reads reaches it unpadded (grouped by real counts)
    stepping = [m.name for m in methods if any(takes(m, h) for h in STEP_HOOKS if h != "samples.step")]
    if stepping and couples_samples(model):
        return (f"method {stepping[0]} takes step hooks and model {type(model).__name__} mixes the samples of a "
                f"batch (BatchNorm): under vmap its steps' padding would enter the batch statistics")
    extra = [m.name for m in methods if gives(m, "extra")]
    if extra and keeps_running_stats(model):
        return (f"method {extra[0]} adds an extra loss, and model {type(model).__name__} keeps BatchNorm running "
                "statistics: a training-mode forward of the model inside that loss updates them in place, which "
                "vmap cannot do on the one module all clients share")
    return None


def choose_path(model: nn.Module, hp: Hyper, methods: list[Method], execution: str = "batched") -> EnginePath:
    """The run's path: sequential when asked for or needed, else stacked where supported, else vmap."""
    if execution == "sequential":
        return EnginePath("sequential", "client_execution: sequential")
    needed = sequential_refusal(model, methods)
    if needed is not None:
        return EnginePath("sequential", needed)
    if hp.precision == "bf16-mixed" and keeps_running_stats(model):
        return EnginePath("sequential", f"precision bf16-mixed on model {type(model).__name__}, which keeps BatchNorm "
                                        "running statistics: under vmap torch's batch norm refuses bfloat16 inputs "
                                        "beside float32 running statistics")
    refusal = stacked_refusal(model, hp, methods)
    if refusal is None:
        return EnginePath("stacked", f"model {type(model).__name__} lists its layers, {local_optim.describe(hp)} "
                                     f"steps in its layers' backward, and every method's hooks have a fused form")
    return EnginePath("vmap", refusal)


def trainer_kind(execution: str, path: str) -> str:
    """The trainer of a run: ``client_execution``'s, except sequential where the engine's path is sequential
    (a method's ``sequential_reason``, said with the path line)."""
    return "sequential" if path == "sequential" else execution
