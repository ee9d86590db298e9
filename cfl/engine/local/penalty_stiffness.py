"""Why a run diverged, when a quadratic penalty is the cause: local SGD with learning rate ``lr`` and heavy-ball
momentum ``m`` on ``weight / 2 * (w - anchor)^2`` is stable only while ``lr * weight < 2 (1 + m)``; past that,
each step overshoots the anchor by more than it started from and the penalty itself blows up, whatever the task
loss does. Importance-weighted penalties (SI's path integral, MAS's output-norm gradients, EWC's Fisher) reach
such weights on a few parameters, e.g. on non-IID clients. Checked only after a run has stopped on a non-finite
loss or update, for the clients named, so it costs nothing on the way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch

from cfl.config.keys import Config
from cfl.config.lr_groups import lr_of as group_lr
from cfl.engine.local import hooks
from cfl.methods.base import Method
from cfl.methods.declarations import gives
from cfl.records.client_states import MethodState
from cfl.tensors import Params, State


def stiffness_hint(cfg: Config, methods: list[Method], states: list[MethodState], broadcasts: list[State],
                   params: Params, cids: list[int]) -> str:
    """A sentence naming the penalty weight that makes the clients' SGD steps unstable, or ``""`` (another
    optimiser, no penalty, or every weight below the bound)."""
    if cfg.optimizer.name != "sgd" or cfg.lr <= 0:
        return ""

    def lr_of(name: str) -> float:  # lr_groups: the parameter's own
        return group_lr(cfg.lr, cfg.lr_groups, name)

    for method, state, broadcast in zip(methods, states, broadcasts, strict=True):
        if not gives(method, "penalty"):
            continue
        worst = _heaviest(method, state, broadcast, params, cids, lambda k: lr_of(k) / cfg.lr)
        if worst is None:
            continue
        weight, name, cid = worst
        lr = lr_of(name)
        bound = 2.0 * (1.0 + cfg.momentum) / lr
        if weight < bound:
            continue
        knobs = ", ".join(f.name for f in fields(method.Hyperparams)) or "its parameters"
        return (f"Likely cause: method {method.name}'s penalty has weight {weight:.4g} on parameter {name} of "
                f"client {cid}; a local SGD step (lr {lr}, momentum {cfg.momentum}) on a quadratic penalty "
                f"diverges where lr x weight > 2 (1 + momentum), here {lr * weight:.3g} > "
                f"{2.0 * (1.0 + cfg.momentum):.3g}: lower the penalty's strength (method {method.name}'s parameters: "
                f"{knobs}) so that its weight stays below {bound:.4g}, or lower "
                f"{'lr' if lr == cfg.lr else 'its lr_groups rate'}")
    return ""


def _heaviest(method: Method, state: MethodState, broadcast: State, params: Params, cids: list[int],
              scale: Callable[[str], float]) -> tuple[float, str, int] | None:
    """The penalty weight over the clients ``cids`` that is largest times ``scale`` of its parameter (its lr over
    ``lr``: 1 without lr_groups): (weight, parameter, client), or None."""
    worst: tuple[float, str, int] | None = None
    worst_key = 0.0
    for cid in cids:
        try:
            quadratics = hooks.round_terms(method, "penalty", state.clients.get(cid), lambda q: q or {}, params,
                                           broadcast)
        except Exception:  # noqa: BLE001 - a diagnosis of a stopped run: the run's own error is what is raised
            return worst
        for name, q in quadratics.items():
            if not hasattr(q, "weight"):  # a Linear term: no stiffness
                continue
            weight = float(torch.as_tensor(q.weight).abs().max())
            if worst is None or weight * scale(name) > worst_key:
                worst, worst_key = (weight, name, cid), weight * scale(name)
    return worst
