"""The stacked path's autograd kernels (cfl/engine/local/stacked_net.py): a linear layer over stacked clients whose
backward takes its own SGD step in place (:class:`FusedLinearSGD`), ReLU and dropout in one pass each way
(:class:`ReluDropout`), a quadratic penalty's gradient folded into the step (:func:`penalty_pre_step`), and the
in-place products and masks they share."""

from __future__ import annotations

from typing import Protocol

import torch

from cfl.engine.local.precision import LOW, Bf16Weights
from cfl.engine.local.scratch import Scratch
from cfl.models.dropout import Dropout

PenaltyStep = tuple[torch.Tensor | None, torch.Tensor | None]  # (M, N) of :func:`penalty_pre_step`



class OptimizerStep(Protocol):
    """What takes a materialised gradient's step with a stateful optimiser (momentum, Adam): the StackedNet."""

    def step(self, name: str, p: torch.Tensor, g: torch.Tensor, penalty: PenaltyStep | None) -> None: ...


class FusedLinearSGD(torch.autograd.Function):
    """``act(in_scale * x @ weight^T + bias)`` over stacked clients, ``weight`` (C, out, in) as ``nn.Linear``
    stores it; the backward steps ``weight`` and ``bias`` in place.

    ``in_scale``: the inverted-dropout scale ``1/keep_prob`` of the layer below, which hands its activations
    over unscaled (``relu(h) * keep``); the scale rides in the products' ``alpha`` instead of costing a pass
    over the activations each way. ``relu``: the ReLU that follows the layer, fused with the bias add, then
    ``dropout``'s 0/1 keep mask (or None), both in place on the fresh output; the backward takes the gradient
    through them where the output is positive, in place on the incoming gradient when that is not a view.
    ``token`` is a scalar that requires grad, so the backward also runs for the first layer (whose input
    does not). The returned gradients of the weights are None: they have been applied. ``low``: in
    bf16-mixed, the :class:`Bf16Weights` and this layer's name: the three products take bfloat16 operands
    (the weights' kept bfloat16 copy) and the step lands on the float32 ``weight`` (``Bf16Weights.step``).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,  # noqa: ANN001
                token: torch.Tensor, lr: float, decay: float, in_scale: float = 1.0,  # noqa: ARG004
                relu: bool = False, dropout: Dropout | None = None,
                penalty: tuple[PenaltyStep | None, PenaltyStep | None] = (None, None),
                low: tuple[Bf16Weights, str] | None = None,
                stateful: tuple[OptimizerStep, str] | None = None,
                preconditioner: torch.Tensor | None = None,
                scratch: tuple[Scratch, str] | None = None) -> torch.Tensor:
        w, b = weight, bias
        if low is not None:  # bf16-mixed: bfloat16 operands (a copy of the float32 weights), float32 steps
            x, w, b = x.to(LOW), low[0].cast(low[1], weight), None if bias is None else bias.to(LOW)
        out = None if scratch is None else scratch[0].get(f"{scratch[1]}.out", (*x.shape[:2], w.shape[1]), x.dtype,
                                                           x.device)
        if not relu and b is not None:  # the bias rides in the product (``beta=1`` over it, broadcast)
            h = torch.baddbmm(b.unsqueeze(1), x, w.mT, beta=1.0, alpha=in_scale, out=out)
        else:
            h = _scaled_bmm(x, w.mT, in_scale, out)
        if relu:
            _add_relu_(h, b)
            if dropout is not None:
                h.mul_(_keep_mask(dropout, h, scratch))
        ctx.save_for_backward(x, h if relu else None)
        ctx.weight, ctx.bias, ctx.lr, ctx.decay, ctx.in_scale = weight, bias, lr, decay, in_scale
        ctx.penalty, ctx.low, ctx.operand, ctx.stateful = penalty, low, w, stateful
        ctx.preconditioner, ctx.scratch = preconditioner, scratch
        return h

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple:  # noqa: ANN001
        x, out = ctx.saved_tensors
        weight, bias, scale = ctx.weight, ctx.bias, ctx.in_scale
        if ctx.preconditioner is not None:  # the weight gradient delta^T X P as delta^T (X P): (B x d x d) products
            x = torch.matmul(x, ctx.preconditioner.to(x.dtype))
        scratch = ctx.scratch
        into = None if scratch is None or out is None else \
            scratch[0].get(f"{scratch[1]}.grad_out", tuple(grad_out.shape), grad_out.dtype, grad_out.device)
        grad = grad_out if out is None else _through_positive(grad_out, out, into)
        grad_x = None
        if ctx.needs_input_grad[0]:
            shape = (*grad.shape[:2], ctx.operand.shape[2])
            buf = None if scratch is None else scratch[0].get(f"{scratch[1]}.grad_in", shape, grad.dtype, grad.device)
            grad_x = _scaled_bmm(grad, ctx.operand, scale, buf)
        weight_penalty, bias_penalty = ctx.penalty
        if ctx.stateful is not None:  # momentum or Adam: the weight gradient is materialised for the optimiser
            net, name = ctx.stateful
            net.step(f"{name}.weight", weight, _scaled_bmm(grad.mT, x, scale).to(weight.dtype), weight_penalty)
            if bias is not None:
                net.step(f"{name}.bias", bias, grad.sum(1, dtype=bias.dtype), bias_penalty)
            return grad_x, None, None, None, None, None, None, None, None, None, None, None, None, None
        penalty_pre_step(weight, weight_penalty)
        if ctx.low is None:
            weight.baddbmm_(grad.mT, x, beta=ctx.decay, alpha=-ctx.lr * scale)
        else:
            ctx.low[0].step(ctx.low[1], weight, grad.mT, x, ctx.decay, -ctx.lr * scale)
        if bias is not None:
            penalty_pre_step(bias, bias_penalty)
            _bias_step(bias, grad, ctx.decay, ctx.lr, scratch)
        return grad_x, None, None, None, None, None, None, None, None, None, None, None, None, None


def penalty_pre_step(p: torch.Tensor, step: PenaltyStep | None) -> None:
    """``p <- M * p + N`` in place, so that the SGD step ``decay * p - lr * g`` that follows lands on
    ``decay * p - lr * (g + A * p - B)``: a quadratic penalty's gradient ``A * p - B`` taken at the step's
    starting weights, in one pass (``M = 1 - lr/decay * A``, ``N = lr/decay * B``; ``StackedNet.penalty_steps``).
    A linear term alone (no A: ``M`` None) adds ``N``."""
    if step is None:
        return
    m, n = step
    if m is None:
        p.add_(n)
    elif n is None:
        p.mul_(m)
    else:
        torch.addcmul(n, p, m, out=p)


def _keep_mask(dropout: Dropout, h: torch.Tensor, scratch: tuple[Scratch, str] | None) -> torch.Tensor:
    """``dropout``'s keep mask of ``h``, drawn and written into scratch buffers when there are."""
    if scratch is None:
        return dropout.keep_mask(h)
    net, name = scratch
    out = net.get(f"{name}.mask", tuple(h.shape), h.dtype, h.device)
    if name in net.drawn:  # drawn for all layers at once (``StackedNet._draw_masks``)
        return dropout.keep_mask(h, out, net.drawn[name], drawn=True)
    return dropout.keep_mask(h, out, net.get(f"{name}.noise", (dropout.noise_words(h.numel()),), torch.int64, h.device))


def _bias_step(bias: torch.Tensor, grad: torch.Tensor, decay: float, lr: float,
               scratch: tuple[Scratch, str] | None) -> None:
    """``bias <- decay * bias - lr * grad.sum(1)``: with a scratch, one product ``ones (C, 1, B) @ grad`` that
    sums the batch and steps in place (``baddbmm_``); else a sum, a scale and an add."""
    if scratch is None or grad.dtype != bias.dtype:
        bias.mul_(decay).add_(grad.sum(1, dtype=bias.dtype), alpha=-lr)
        return
    ones = scratch[0].get("ones", (grad.shape[0], 1, grad.shape[1]), grad.dtype, grad.device, fill=1.0)
    bias.unsqueeze(1).baddbmm_(ones, grad, beta=decay, alpha=-lr)


def _through_positive(grad_out: torch.Tensor, out: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient of ``relu(h) * keep`` (``out``): ``grad_out`` where ``out > 0``, else 0; written into
    ``into`` (a scratch buffer), else into ``grad_out`` itself when it is a tensor of its own (the layer above
    made it for this layer alone)."""
    if into is None:
        into = grad_out if grad_out._base is None and grad_out.is_contiguous() else torch.empty_like(grad_out)
    return torch.ops.aten.threshold_backward.grad_input(grad_out, out, 0, grad_input=into)


def _scaled_bmm(a: torch.Tensor, b: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``scale * a @ b`` batched, the scale applied by the product itself (``beta=0``: no read of ``out``);
    written into ``out`` when given (a scratch buffer)."""
    if scale == 1.0:
        return torch.bmm(a, b, out=out)
    out = a.new_empty((a.shape[0], a.shape[1], b.shape[2])) if out is None else out
    return torch.baddbmm(out, a, b, beta=0.0, alpha=scale, out=out)


def _add_relu_(h: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``h <- relu(h + bias)`` in one pass where torch has the fused kernel (CPU, float32/64), else two."""
    if bias is None:
        h.clamp_min_(0)
    elif h.is_cpu and h.dtype != LOW:
        torch.ops.aten._add_relu_(h, bias.unsqueeze(1))
    else:
        h.add_(bias.unsqueeze(1)).clamp_min_(0)


class ReluDropout(torch.autograd.Function):
    """``dropout(relu(x))`` in one pass each way: ``out = max(x, 0) * keep * scale``; the gradient passes
    where ``out > 0`` (``x > 0`` and kept), scaled. Equal to the two layers, with fewer fresh tensors."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:  # noqa: ANN001
        # in place: ``x`` is a convolution's output, which nothing else keeps (fresh activation-sized
        # tensors cost page faults: the out-of-place version took ~4x as long)
        out = x.clamp_min_(0).mul_(keep).mul_(scale)
        ctx.mark_dirty(x)
        ctx.save_for_backward(out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple:  # noqa: ANN001
        (out,) = ctx.saved_tensors
        return _through_positive(grad_out, out).mul_(ctx.scale), None, None
