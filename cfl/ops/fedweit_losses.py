"""FedWeIT's client regularisers (Yoon et al., ICML 2021, eq. 3), on top of the task's cross-entropy:

    lambda1 * Omega({m^(t), A^(1:t)})  +  lambda2 * sum_{i<t} || dB * m^(i) + dA^(i) ||^2

``Omega`` the L1 norm; the drift term keeps every past task's composed weight ``B * m^(i) + A^(i)`` near the
value it had when the current task began (``dB``, ``dA``: the change since then), so updating the shared base
does not undo earlier tasks (the paper's "retroactive" update of past tasks' parameters).

As the official code (``wyjeong/FedWeIT``, ``models/fedweit/client.py``, ``loss``) computes them, per layer:
- L1: ``lambda_l1 * |A^(t)|_1`` on the current task's adaptive part and on every past task's
  (``+ lambda_mask * |mask logits^(t)|_1``; the code's ``lambda_mask`` is 0);
- drift: ``lambda_l2 * l2_loss(B * sigmoid(mask^(i)) + A^(i) - theta^(i)_stored)`` for each past task ``i``, with
  TensorFlow's ``l2_loss(x) = sum(x^2) / 2`` (half the paper's squared norm: ``halved=True``);
- weight decay ``wd * l2_loss`` on the current ``A`` and mask logits, and on the base on the first task only.
The defaults are the code's ``config.py``: ``lambda_l1`` 1e-3, ``lambda_l2`` 100, ``lambda_mask`` 0, ``wd`` 1e-4.

Parameter names: a decomposed layer ``p`` holds ``p.base`` ``(out, ...)``, ``p.mask`` (logits, ``(T, out)``),
``p.adaptive`` ``(T, out, ...)`` (``cfl.models.fedweit_net``); ``anchors[p]`` ``(t, out, ...)``: the stored
``theta^(i)`` of the past tasks ``i < t`` (:func:`drift_anchors`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cfl.models.fedweit_weight import gate, per_unit
from cfl.tensors import Params


@dataclass(frozen=True)
class RegulariserWeights:
    """The weights of FedWeIT's client regularisers (defaults: the official code's ``config.py``)."""

    lambda_l1: float = 1e-3
    lambda_l2: float = 100.0
    lambda_mask: float = 0.0
    wd: float = 1e-4
    halved: bool = True  # the code's tf.nn.l2_loss (sum x^2 / 2) in the drift and decay terms; False: sum x^2
    #: whether the drift and L1 terms move the past tasks' ``A^(i)`` (the paper's ``dA^(i)``); the code trains only
    #: the current task's parts and the base (False: the past rows enter detached)
    past_adaptive_trained: bool = False


def squared(x: torch.Tensor, halved: bool) -> torch.Tensor:
    """``sum(x^2)``, halved as TensorFlow's ``l2_loss`` where ``halved``."""
    s = (x * x).sum()
    return s / 2 if halved else s


def past_weights(base: torch.Tensor, mask_logits: torch.Tensor, adaptive: torch.Tensor) -> torch.Tensor:
    """``B * sigmoid(mask^(i)) + A^(i)`` for each task ``i`` of ``mask_logits`` ``(n, out)`` and ``adaptive``
    ``(n, out, ...)``: ``(n, out, ...)``, the knowledge base left out (the code's ``get_body_weights``)."""
    return base * per_unit(gate(mask_logits), adaptive) + adaptive


def drift_loss(base: torch.Tensor, mask_logits: torch.Tensor, adaptive: torch.Tensor, anchors: torch.Tensor,
               lambda_l2: float, halved: bool = True) -> torch.Tensor:
    """``lambda_l2 * sum_i ||B * sigmoid(mask^(i)) + A^(i) - anchors[i]||^2`` over the past tasks ``i`` (the rows of
    ``mask_logits``, ``adaptive`` and ``anchors``), halved as the code where ``halved``; 0 with no past task."""
    return lambda_l2 * squared(past_weights(base, mask_logits, adaptive) - anchors, halved)


def sparsity_loss(adaptive: torch.Tensor, mask_logits: torch.Tensor, lambda_l1: float,
                  lambda_mask: float) -> torch.Tensor:
    """``lambda_l1 * |adaptive|_1 + lambda_mask * |mask_logits|_1`` (pass the tasks each term covers)."""
    return lambda_l1 * adaptive.abs().sum() + lambda_mask * mask_logits.abs().sum()


def layer_regulariser(params: Params, prefix: str, task: int, anchors: torch.Tensor | None,
                      w: RegulariserWeights) -> torch.Tensor:
    """The code's regularisers of one decomposed layer ``prefix`` while client trains task ``task`` (0-based):
    L1 on ``A^(0..t)`` and the mask logits of ``t``, weight decay on ``A^(t)``, mask logits of ``t`` (and the base
    when ``t == 0``), the drift of the past tasks against ``anchors`` ``(t, out, ...)`` (None on the first task).
    The past tasks' mask logits enter detached (fixed, as in the paper and the code)."""
    base, mask, adaptive = params[f"{prefix}.base"], params[f"{prefix}.mask"], params[f"{prefix}.adaptive"]
    past = adaptive[:task] if w.past_adaptive_trained else adaptive[:task].detach()
    if task > 0 and (anchors is None or anchors.shape[0] != task):
        raise ValueError(f"layer_regulariser: task {task} needs the stored weights of {task} past task(s) for "
                         f"{prefix}, got {None if anchors is None else anchors.shape[0]}")
    loss = sparsity_loss(adaptive[task], mask[task], w.lambda_l1, w.lambda_mask) + w.lambda_l1 * past.abs().sum()
    loss = loss + w.wd * (squared(adaptive[task], w.halved) + squared(mask[task], w.halved))
    if task == 0:
        return loss + w.wd * squared(base, w.halved)
    return loss + drift_loss(base, mask[:task].detach(), past, anchors, w.lambda_l2, w.halved)


def regulariser(params: Params, prefixes: list[str], task: int, anchors: Params, w: RegulariserWeights) -> torch.Tensor:
    """:func:`layer_regulariser` summed over the decomposed layers ``prefixes``; ``anchors`` keyed by prefix."""
    return sum((layer_regulariser(params, p, task, anchors.get(p), w) for p in prefixes),
               start=params[f"{prefixes[0]}.base"].new_zeros(()))


def drift_anchors(params: Params, prefixes: list[str], task: int) -> Params:
    """The stored ``theta^(i) = B * sigmoid(mask^(i)) + A^(i)`` of the tasks ``i < task`` per layer, taken when
    ``task`` begins (the code recomputes them all then, from the client's base at that moment)."""
    return {p: past_weights(params[f"{p}.base"], params[f"{p}.mask"][:task], params[f"{p}.adaptive"][:task])
            .detach().clone() for p in prefixes}
