"""The local optimisers' per-parameter step, shared by every training path: SGD (momentum), Adam and AdamW.

One formula for the sequential trainer (one client, no client dim), the vmap path and the stacked path
(parameters with a leading client dim), so that the paths agree up to float rounding. The optimiser's state
is fresh each round (``optimizer.state: fresh``: every client starts from zero moments and step 0) or kept per
client across rounds (``kept``: :func:`kept_state`, :func:`stored_state`; the step count runs on, so Adam's bias
correction uses each client's own count, a ``(C,)`` tensor ``t`` on the batched paths).

- ``sgd``: ``g <- g + wd * p``; with momentum ``mu``, ``b <- mu * b + g`` (``b`` starts at 0, so the first
  step's ``b`` is ``g``, as torch.optim.SGD's clone); ``p <- p - lr * b``.
- ``adam`` (torch.optim.Adam): ``g <- g + wd * p``; ``m <- beta1 * m + (1 - beta1) * g``;
  ``v <- beta2 * v + (1 - beta2) * g^2``; ``p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``
  at step ``t = 1, 2, ...``.
- ``adamw`` (torch.optim.AdamW): ``p <- (1 - lr * wd) * p`` first (decoupled decay), then Adam's step without
  the L2 term.

``lr_groups`` (:attr:`Hyper.lr_groups`) gives the parameters whose names start with a prefix their own ``lr`` in
every formula above (:func:`lr_of`, :func:`param_hyper`); without groups every parameter steps with ``hp`` itself.

A method's gradient projection (GPM) applies to ``g`` after the L2 term and before the moments
(:func:`decayed`, then the projection, then :func:`apply_`). Clients of one step all have the same step count
``t`` (the clients still training at a step are a prefix of the stack, and all started at step 0), so
``t`` is one number; a finished client's rows are not passed in, so its moments and parameters stay put.
"""

from __future__ import annotations

import dataclasses

import torch

from cfl.config.lr_groups import lr_of as group_lr
from cfl.engine.local.jobs import Hyper
from cfl.tensors import State

#: state tensors per parameter (each like the parameter)
SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}


def plain_sgd(hp: Hyper) -> bool:
    """SGD without momentum: no optimiser state (the stacked path's fused in-place step)."""
    return hp.optimizer == "sgd" and hp.momentum == 0


def describe(hp: Hyper) -> str:
    """The optimiser in words for the engine's path line, e.g. ``adam`` or ``SGD with momentum 0.9``."""
    if hp.optimizer == "sgd":
        return "plain SGD" if hp.momentum == 0 else f"SGD with momentum {hp.momentum}"
    return hp.optimizer


def lr_of(hp: Hyper, name: str) -> float:
    """Parameter ``name``'s learning rate: that of its longest matching ``lr_groups`` prefix, else ``hp.lr``."""
    return group_lr(hp.lr, hp.lr_groups, name)


def param_hyper(hp: Hyper, name: str) -> Hyper:
    """``hp`` with parameter ``name``'s learning rate (:func:`lr_of`): ``hp`` itself where that is ``hp.lr``."""
    lr = lr_of(hp, name)
    return hp if lr == hp.lr else dataclasses.replace(hp, lr=lr)


def new_slots(hp: Hyper, like: torch.Tensor) -> list[torch.Tensor]:
    """Fresh (zero) state for a parameter like ``like``: none for plain SGD."""
    return [] if plain_sgd(hp) else [torch.zeros_like(like) for _ in range(SLOTS[hp.optimizer])]


def decayed(hp: Hyper, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``g`` with the L2 weight-decay term ``wd * p`` (sgd, adam; a new tensor); adamw's decay is decoupled."""
    if hp.weight_decay and hp.optimizer != "adamw":
        return g + hp.weight_decay * p
    return g


def _bias(beta: float, t: int | torch.Tensor, p: torch.Tensor) -> float | torch.Tensor:
    """``1 - beta^t``: a number, or per client ``(n, 1, ...)`` against the stacked ``p`` for a ``(n,)`` ``t``."""
    if isinstance(t, int):
        return 1 - beta**t
    # in float64, as the int path's Python floats: 1 - 0.999^t in float32 is off by ~1e-5 relative at t = 1
    return (1 - beta ** t.double()).to(p.dtype).view(-1, *([1] * (p.dim() - 1)))


def apply_(hp: Hyper, p: torch.Tensor, g: torch.Tensor, slots: list[torch.Tensor], t: int | torch.Tensor) -> None:
    """One step of ``p`` in place from the (decayed, projected) gradient ``g`` and the state ``slots``
    (:func:`new_slots`, the rows of the clients in ``p``), at step ``t`` (1 for the first; kept state: each
    client's own count, a ``(n,)`` tensor for stacked ``p``); ``hp``: the parameter's own (:func:`param_hyper`)."""
    if hp.optimizer == "sgd":
        if hp.momentum:
            g = slots[0].mul_(hp.momentum).add_(g)
        p.sub_(hp.lr * g)
        return
    beta1, beta2 = hp.betas
    m, v = slots
    if hp.optimizer == "adamw" and hp.weight_decay:
        p.mul_(1 - hp.lr * hp.weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    if isinstance(t, int):
        denom = (v.sqrt() / (1 - beta2**t) ** 0.5).add_(hp.eps)
        p.addcdiv_(m, denom, value=-hp.lr / (1 - beta1**t))
        return
    denom = (v.sqrt() / _bias(beta2, t, p).sqrt()).add_(hp.eps)
    p.sub_(hp.lr * m / denom / _bias(beta1, t, p))


def step_(hp: Hyper, p: torch.Tensor, g: torch.Tensor, slots: list[torch.Tensor], t: int | torch.Tensor) -> None:
    """:func:`decayed` then :func:`apply_` (no projection between)."""
    apply_(hp, p, decayed(hp, p, g), slots, t)


# ---- optimizer.state: kept ----
def kept_state(hp: Hyper, params: dict[str, torch.Tensor], stored: list[State]) -> tuple[dict, torch.Tensor]:
    """The clients' kept optimiser state stacked over them: ``{name: slots (C, ...)}`` and their step counts
    ``(C,)`` so far (zeros and 0 for a client without one); ``params``: one client's (no client dim)."""
    slots = {k: [torch.stack([st["slots"][k][str(i)] if st else torch.zeros_like(v) for st in stored])
                 for i in range(SLOTS[hp.optimizer])] for k, v in params.items()}
    steps = torch.tensor([int(st["t"]) if st else 0 for st in stored], dtype=torch.long)
    return slots, steps


def stored_state(slots: dict[str, list[torch.Tensor]], steps: int | torch.Tensor, row: int | None = None) -> State:
    """One client's kept state to store: its slots (row ``row`` of stacked ones) and its step count."""
    pick = (lambda v: v.detach().clone()) if row is None else (lambda v: v[row].detach().clone())
    return {"t": torch.tensor(int(steps)), "slots": {k: {str(i): pick(v) for i, v in enumerate(vs)}
                                                    for k, vs in slots.items()}}
