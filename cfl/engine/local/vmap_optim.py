"""The vmap path's optimisers on stacked parameters ``(C, ...)`` (:mod:`cfl.engine.local.vmap`): plain SGD with
momentum and weight decay, Adam and AdamW (:mod:`cfl.engine.local.local_optim`), each stepping only the clients still
training (a prefix of the stack), with the methods' gradient projections (GPM) per client under ``vmap``.

The parameter update is the memory-bound part of a step (the stacked parameters are read and written once per
step); see :class:`SGDStep` and ``docs/performance.md``.
"""

from __future__ import annotations

import torch
from torch.func import vmap

from cfl.engine.local import hooks, local_optim
from cfl.engine.local.jobs import Hyper, RoundMethods
from cfl.methods.base import Method
from cfl.methods.declarations import gives
from cfl.tensors import Params, State


class SGDStep:
    """Plain SGD with weight decay on stacked parameters, leaving clients without a step at ``s`` untouched.

    Without momentum or gradient projections the decay is folded into the update with one ``lerp_`` pass:
    the loss is scaled by ``-1/wd`` so the gradients come back as ``-g/wd`` and
    ``p + lr*wd * (-g/wd - p) = (1 - lr*wd) p - lr g``. That reads the parameters and gradients once and
    writes the parameters once, against three read-write passes for "decay, then step".

    ``lr_groups``: each parameter steps at its own learning rate (the foreach operators per group of parameters with
    one rate; without groups one group of all, as before).
    """

    def __init__(self, hp: Hyper, params: Params, round_methods: RoundMethods, stepping: bool = False) -> None:
        self.hp = hp
        self.projecting = [i for i, m in enumerate(round_methods.methods) if gives(m, "projection")]
        # step hooks must see the true gradient, not the folded decay's -g/wd
        self.fused = hp.momentum == 0 and not self.projecting and not stepping
        self.fold_decay = self.fused and hp.weight_decay >= 1e-8  # smaller: -1/wd could overflow float32
        self.loss_scale = -1.0 / hp.weight_decay if self.fold_decay else 1.0
        self.momentum: list[torch.Tensor] | None = None
        self.kept = False  # optimizer.state: kept: the momentum buffers start from the clients' own
        self.names = list(params)
        self.shapes = {k: (-1,) + (1,) * (v.dim() - 1) for k, v in params.items()}
        self.lrs = [local_optim.lr_of(hp, k) for k in self.names]  # hp.lr for all without lr_groups
        # lr_groups: (lr, the positions of its parameters in params); None: every parameter at hp.lr
        self.groups = None if not hp.lr_groups else \
            [(lr, [i for i, r in enumerate(self.lrs) if r == lr]) for lr in dict.fromkeys(self.lrs)]

    def keep(self, slots: dict[str, list[torch.Tensor]]) -> None:
        """Start from the clients' kept momentum buffers (:func:`cfl.engine.local.local_optim.kept_state`)."""
        self.momentum, self.kept = [slots[k][0] for k in self.names], True

    def kept_slots(self) -> dict[str, list[torch.Tensor]]:
        return {k: [b] for k, b in zip(self.names, self.momentum, strict=True)}

    def __call__(self, s: int | torch.Tensor, params: Params, grads: Params, active: torch.Tensor | None, states: list,
                 round_methods: RoundMethods) -> None:
        """``grads`` are those of ``loss_scale`` x the summed client losses; ``active`` (C,) or None (all); ``s``
        the step (kept state: each client's steps so far, ``(n,)``)."""
        hp, p, g = self.hp, list(params.values()), list(grads.values())
        if self.fold_decay:
            if active is None:
                for lr, (pg, gg) in self._by_lr(p, g):
                    torch._foreach_lerp_(pg, gg, lr * hp.weight_decay)
            else:
                rates = {lr: active.to(p[0].dtype) * (lr * hp.weight_decay) for lr in dict.fromkeys(self.lrs)}
                for k, pk, gk, lr in zip(params, p, g, self.lrs, strict=True):
                    pk.lerp_(gk, rates[lr].view(self.shapes[k]))
            return
        if hp.weight_decay:
            torch._foreach_add_(g, p, alpha=hp.weight_decay)
        for i in self.projecting:
            g = list(_projected(round_methods.methods[i], dict(zip(params, g, strict=True)), states[i]).values())
        if hp.momentum > 0:
            if not self.kept and s == 0:
                self.momentum = [gk.clone() for gk in g]
            bufs = [b[: gk.shape[0]] for b, gk in zip(self.momentum, g, strict=True)]  # the clients still training
            if self.kept or s > 0:
                torch._foreach_mul_(bufs, hp.momentum)
                torch._foreach_add_(bufs, g)
            g = bufs
        if active is None:
            for lr, (pg, gg) in self._by_lr(p, g):
                torch._foreach_add_(pg, gg, alpha=-lr)
        else:
            on = active.to(p[0].dtype)
            for k, pk, gk, lr in zip(params, p, g, self.lrs, strict=True):
                pk.addcmul_(gk, on.view(self.shapes[k]), value=-lr)

    def _by_lr(self, p: list[torch.Tensor], g: list[torch.Tensor]) -> list[tuple[float, tuple[list, list]]]:
        """The parameters and their gradients per learning rate: all of them at ``hp.lr`` without lr_groups."""
        if self.groups is None:
            return [(self.hp.lr, (p, g))]
        return [(lr, ([p[i] for i in at], [g[i] for i in at])) for lr, at in self.groups]


class OptimStep:
    """Momentum-free SGD's counterpart for Adam and AdamW (:mod:`cfl.engine.local.local_optim`) on stacked parameters:
    per-client moments ``(C, ...)``, fresh each round; a step updates only the clients still training (the
    prefix of the stack in ``params``), so a client past its last step keeps its moments and parameters."""

    loss_scale = 1.0

    def __init__(self, hp: Hyper, params: Params, round_methods: RoundMethods, stepping: bool = False) -> None:  # noqa: ARG002
        self.hp = hp
        self.projecting = [i for i, m in enumerate(round_methods.methods) if gives(m, "projection")]
        self.slots: dict[str, list[torch.Tensor]] | None = None
        self.own = {k: local_optim.param_hyper(hp, k) for k in params}  # lr_groups: each parameter's learning rate

    def keep(self, slots: dict[str, list[torch.Tensor]]) -> None:
        """Start from the clients' kept moments (:func:`cfl.engine.local.local_optim.kept_state`)."""
        self.slots = slots

    def kept_slots(self) -> dict[str, list[torch.Tensor]]:
        return self.slots

    def __call__(self, s: int | torch.Tensor, params: Params, grads: Params, active: torch.Tensor | None,
                 states: list, round_methods: RoundMethods) -> None:
        """As :meth:`SGDStep.__call__`; ``active`` must be None (every client in ``params`` steps)."""
        if active is not None:
            raise ValueError("OptimStep steps every client it is given; pass the clients still training")
        if self.slots is None:  # the first step (after the parameters took the gradients' layout)
            self.slots = {k: local_optim.new_slots(self.hp, v) for k, v in params.items()}
        g = {k: local_optim.decayed(self.hp, params[k], gk) for k, gk in grads.items()}
        for i in self.projecting:  # GPM: the projected gradient enters the moments
            g = _projected(round_methods.methods[i], g, states[i])
        for k, p in params.items():
            local_optim.apply_(self.own[k], p, g[k], [slot[: p.shape[0]] for slot in self.slots[k]], s + 1)


def _projected(method: Method, grads: Params, state: State) -> Params:
    """The stacked clients' gradients projected off ``method.round_terms``' projection, per client under ``vmap``.
    Where no client of the stack holds state (``state`` is ``{}``) every client's hook sees ``{}``: it is
    called once and its bases, if any, apply to all (a hook that reads no state projects all the same)."""
    if state:
        return vmap(lambda gr, st: hooks.projected(method, gr, st))(grads, state)
    bases = hooks.state_free_bases(method, {k: v[0] for k, v in grads.items()})
    return vmap(lambda gr: hooks.project(gr, bases))(grads) if bases else grads
