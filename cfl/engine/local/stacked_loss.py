"""The stacked path's weighted cross-entropy in three dispatched operators a step (against twenty for
``weighted_mean(masked_cross_entropy(...))`` and its autograd backward): a launch-bound GPU round pays per
operator (``docs/performance.md``, "Kernels and host reads per round").

Each client's loss is ``sum_b w_b * -log p(y_b | x_b) / sum_b w_b`` (:func:`cfl.ops.losses.weighted_mean`
of the per-sample cross-entropy). Both the label pick and the weighting are one tensor of targets
``T[c, b, k] = -[k = y_b] * w_b / sum w`` (:func:`loss_targets`, built once a round for the whole
schedule), so the loss is ``<log_softmax(logits), T>`` per client and the gradient of the clients' summed
losses with respect to the log-probabilities is ``T`` itself: ``log_softmax``, its backward of ``T`` (handed
to autograd at the logits) and ``T *= log p`` in place, whose sums, once a round, are the losses. The
gradients equal the autograd ones bit for bit (the same ``-w / sum w`` values into the same ``log_softmax``
backward); the loss's value is summed in another order (float rounding, ~1e-7 relative), and a weight-0 (padding) sample
whose log-probability is infinite makes the loss NaN where ``weighted_mean`` dropped it.
"""

from __future__ import annotations

import torch


def loss_targets(y: torch.Tensor, weight: torch.Tensor, classes: int) -> torch.Tensor:
    """``(..., B, classes)`` targets of labels ``y`` and sample weights ``weight`` ``(..., B)``: ``-w_b / sum w``
    (the sum clamped at 1e-12, as :func:`cfl.ops.losses.weighted_mean`) at each sample's label, 0 elsewhere."""
    share = weight * torch.reciprocal(weight.sum(-1, keepdim=True).clamp(min=1e-12))
    targets = torch.zeros((*y.shape, classes), dtype=weight.dtype, device=weight.device)
    return targets.scatter_(-1, y.unsqueeze(-1), share.neg_().unsqueeze(-1))


def weighted_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                           excluded: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient of the clients' summed losses with respect to logits ``(n, B, K)`` against
    :func:`loss_targets` ``(n, B, K)`` (``log_softmax``'s backward of ``targets``), to back-propagate from the
    logits on; ``targets`` become the losses' terms in place (``T * log p``: a client's loss is the sum of
    its rows, summed by the caller, once a round for the round's targets). ``excluded``: where the logits
    were masked to -inf (classes outside a client's softmax, ``(n, 1, K)``): their log-probabilities, -inf
    against 0 targets, leave the terms (an excluded label still gives an infinite loss, as in
    :func:`cfl.ops.losses.masked_cross_entropy`)."""
    with torch.no_grad():
        logp = torch.log_softmax(logits, -1)
        grad = torch._log_softmax_backward_data(targets, logp, -1, logp.dtype)
        targets.mul_(logp if excluded is None else logp.masked_fill(excluded & (targets == 0), 0.0))
        return grad
