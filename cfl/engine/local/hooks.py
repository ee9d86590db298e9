"""The engine's side of the one-client training hooks: a declared quadratic penalty as a loss and as the
``A * w - B`` terms of its gradient, the per-sample extra loss averaged over real samples, and the
gradient projection. Each function takes one client; the batched trainer ``vmap``s them over clients.
Each calls its hook through :func:`cfl.engine.hook_call.call` (a failure names the method and the hook) and
checks the result against the hook's rule (:mod:`cfl.engine.hook_rules`)."""

from __future__ import annotations

from typing import Any

import torch
from torch.func import vmap

from cfl.engine.hook_call import call, made_finite, refuse
from cfl.engine.hook_rules import (
    EXTRA_LOSS,
    REPLAY,
    STEP_SAMPLES,
    TASK_LOSS,
    asked_part,
    check_carry_start,
    check_carry_step,
    check_extra_loss,
    check_penalty,
    check_preconditioner,
    check_projection,
    check_replay,
    check_step_gradient,
    check_step_samples,
)
from cfl.methods.base import Method
from cfl.methods.client_hooks import ClientRound, ClientRoundStart, ClientStart, RoundTerms, part_of
from cfl.methods.hook_types import Linear, Quadratic, Samples, Step
from cfl.methods.training_hooks import Draw, LossContext, LossTerms, SamplesContext
from cfl.ops.losses import weighted_mean
from cfl.ops.subspace import project_out
from cfl.tensors import Params, State

#: name -> (A, B) of the gradient A * w - B; A is None for a linear term alone (gradient -B)
PenaltyTerms = dict[str, tuple[torch.Tensor | None, torch.Tensor]]


def quadratic_loss(params: Params, quadratics: dict[str, Quadratic | Linear] | None,
                   linear_terms: bool = True) -> torch.Tensor:
    """``sum_k weight_k / 2 * (w_k - anchor_k)^2 + <linear_k, w_k>`` (0 without terms; ``linear_terms`` False: the
    quadratic part alone)."""
    total = torch.zeros((), device=next(iter(params.values())).device)
    linear = torch.zeros((), device=total.device)
    for k, q in (quadratics or {}).items():
        if isinstance(q, Linear):
            linear = linear + (q.coef * params[k]).sum()
            continue
        total = total + (q.weight * (params[k] - q.anchor) ** 2).sum()
        if q.linear is not None:
            linear = linear + (q.linear * params[k]).sum()
    return 0.5 * total + linear if linear_terms else 0.5 * total


def _numbers(q: Quadratic | Linear) -> dict[str, torch.Tensor | float]:
    """A term's tensors and numbers, for the finite check."""
    if isinstance(q, Linear):
        return {"coef": q.coef}
    return {"weight": q.weight, "anchor": q.anchor, **({} if q.linear is None else {"linear": q.linear})}


def round_terms(method: Method, part: str, state: State, use: Any, global_params: Params | None = None,
                server: State | None = None, finite: dict[str, Any] | None = None) -> Any:
    """``method.round_terms``'s ``part`` for one client (``use``: the engine's check and use of the part)."""
    return call(method, "round_terms", ClientRound(part, state, global_params, server),
                use=lambda result: use(part_of(result, part, method.computes.terms, RoundTerms)), finite=finite)


def client_start(method: Method, part: str, use: Any, **ctx: Any) -> Any:
    """``method.client_start``'s ``part`` (the context's fields ``ctx``; ``use``: the check and use of the part)."""
    return call(method, "client_start", ClientRoundStart(part, **ctx),
                use=lambda result: use(part_of(result, part, method.computes.starts, ClientStart)))


def penalty_loss(method: Method, params: Params, global_params: Params, server: State, state: State,
                 linear_terms: bool = True) -> torch.Tensor | None:
    """One client's penalty, derived from its declared terms (``linear_terms`` False: the quadratic part alone, None
    where the method declares linear terms only)."""
    def use(result: Any) -> torch.Tensor | None:
        quadratics = check_penalty(result, params)
        made_finite({k: _numbers(q) for k, q in quadratics.items()}, {"global_params": global_params, "state": state})
        if not linear_terms and quadratics and all(isinstance(q, Linear) for q in quadratics.values()):
            return None
        return quadratic_loss(params, quadratics, linear_terms)
    return round_terms(method, "penalty", state, use, global_params, server)


def _terms(method: Method, global_params: Params, server: State, state: State) -> PenaltyTerms:
    def use(result: Any) -> PenaltyTerms:
        out = {}
        for k, q in check_penalty(result, global_params).items():
            if isinstance(q, Linear):  # gradient coef: A none, B = -coef
                out[k] = (None, -q.coef)
                continue
            like = global_params[k]
            weight = q.weight if isinstance(q.weight, torch.Tensor) else torch.tensor(q.weight, dtype=like.dtype,
                                                                                       device=like.device)
            b = q.anchor * q.weight
            out[k] = (weight, b if q.linear is None else b - q.linear)
        return out
    return round_terms(method, "penalty", state, use, global_params, server)


def penalty_terms(method: Method, global_params: Params, server: State, stacked: State) -> PenaltyTerms:
    """``(A, B)`` per parameter for the clients of the ``stacked`` state, with a leading client dim (1 when
    no client has state: the same terms for all); A None for a linear term alone."""
    if stacked:
        terms = vmap(lambda st: _split(_terms(method, global_params, server, st)))(stacked)
        return _joined(*terms)
    return {k: (None if a is None else a.unsqueeze(0), b.unsqueeze(0))
            for k, (a, b) in _terms(method, global_params, server, {}).items()}


def _split(terms: PenaltyTerms) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The A's and the B's apart (``vmap`` returns tensors only, no None)."""
    return {k: a for k, (a, _) in terms.items() if a is not None}, {k: b for k, (_, b) in terms.items()}


def _joined(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> PenaltyTerms:
    return {k: (a.get(k), v) for k, v in b.items()}


def task_loss(method: Method, params: Params, logits: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
              task: torch.Tensor, weight: torch.Tensor, allowed: torch.Tensor | None, server: State,
              state: State) -> torch.Tensor:
    """One client's per-sample task loss ``(B,)``, ``method.loss``'s task part (not yet averaged)."""
    ctx = LossContext("task", params, x, task, weight, server, state, None, logits, y, allowed)
    return call(method, "loss", ctx,
                use=lambda terms: check_extra_loss(
                    asked_part(terms, LossTerms, "task", method.computes.losses, TASK_LOSS), logits, TASK_LOSS),
                finite={"params": params, "logits": logits, "x": x, "state": state})


def differentiable(method: Method, loss: torch.Tensor) -> torch.Tensor:
    """``loss`` (``method.loss``'s task part, outside ``vmap``, where ``requires_grad`` is seen) when it carries a
    gradient: the step's gradient is its gradient, so a constant would train nothing."""
    if torch.is_grad_enabled() and not loss.requires_grad:
        refuse(method, "loss", f"{TASK_LOSS}; got a tensor without grad_fn: it is not computed from logits or "
               "params, so no step would train the model")
    return loss


def extra_loss(method: Method, params: Params, x: torch.Tensor, task: torch.Tensor, weight: torch.Tensor,
               server: State, state: State, samples: Samples | None = None) -> torch.Tensor:
    """One client's extra loss, ``method.loss``'s extra part, averaged over its real samples (``weight`` 0 marks
    padding); ``samples``: the method's step draw."""
    ctx = LossContext("extra", params, x, task, weight, server, state, samples)
    loss = call(method, "loss", ctx,
                use=lambda terms: check_extra_loss(
                    asked_part(terms, LossTerms, "extra", method.computes.losses, EXTRA_LOSS), x),
                finite={"params": params, "x": x, "state": state})
    return weighted_mean(loss, weight)


def project(grads: Params, bases: dict[str, torch.Tensor]) -> Params:
    """Gradients with their component in each basis removed (GPM: ``g - (g M) M^T``)."""
    return {k: project_out(g, bases[k]) if k in bases else g for k, g in grads.items()}


def projected(method: Method, grads: Params, state: State) -> Params:
    """One client's gradients projected off ``method.round_terms``' projection."""
    bases = round_terms(method, "projection", state, lambda bases: check_projection(bases, grads),
                        finite={"state": state})
    return project(grads, bases)


def state_free_bases(method: Method, grads: Params) -> dict[str, torch.Tensor]:
    """``method.round_terms``' projection of state ``{}``, checked against one client's ``grads``: the bases of every
    client of a stack in which none holds state."""
    return round_terms(method, "projection", {}, lambda bases: check_projection(bases, grads))


def replayed(method: Method, state: State, generator: torch.Generator, like: torch.Tensor,
             server: State) -> Samples | None:
    """One client's replay samples for a step, ``method.samples``' replay part (``like``: the stream's inputs, whose
    shape they must have; ``server``: the method's broadcast)."""
    return call(method, "samples", SamplesContext("replay", state, generator, server, {}),
                use=lambda draw: check_replay(asked_part(draw, Draw, "replay", method.computes.draws, REPLAY), like))


def step_samples(method: Method, state: State, generator: torch.Generator, like: torch.Tensor,
                 server: State, carry: State | None = None) -> Samples | None:
    """One client's step draw, ``method.samples``' step part; ``server``: the method's broadcast, ``carry``: the
    client's running values before the step ({} where the method keeps none)."""
    ctx = SamplesContext("step", state, generator, server, carry if carry is not None else {})
    return call(method, "samples", ctx, use=lambda draw: check_step_samples(
        asked_part(draw, Draw, "step", method.computes.draws, STEP_SAMPLES), like))


def step_gradient(method: Method, step: Step) -> Params:
    """One client's step gradient after ``method.step_gradient`` (``step.grads`` where it returns None)."""
    result = call(method, "step_gradient", step, use=lambda grads: check_step_gradient(grads, step.grads),
                  finite={"step.params": step.params, "step.grads": step.grads, "step.state": step.state})
    return step.grads if result is None else {k: result[k] for k in step.grads}


def carry_start(method: Method, global_params: Params, state: State, server: State) -> State:
    """One client's running values at its round start, ``method.client_start``'s carry (``{}`` where None)."""
    return client_start(method, "carry", lambda carry: check_carry_start({} if carry is None else carry),
                        server=server, state=state, global_params=global_params)


def carry_step(method: Method, step: Step) -> State:
    return call(method, "carry_step", step, use=lambda carry: check_carry_step(carry, step.carry),
                finite={"step.carry": step.carry, "step.grads": step.grads, "moved": step.moved})


def preconditioners(method: Method, params: Params, state: State) -> dict[str, torch.Tensor]:
    """One client's ``method.round_terms``' preconditioner matrices, checked against the parameters (one
    client's)."""
    return round_terms(method, "preconditioner", state, lambda matrices: check_preconditioner(matrices, params),
                       finite={"state": state})


def stacked_preconditioners(method: Method, params: Params, stacked: State) -> dict[str, torch.Tensor]:
    """``(C, d, d)`` per parameter for the clients of the ``stacked`` state (a client dim of 1 when no client holds
    state: the same matrices for all); ``params``: one client's."""
    if stacked:
        return vmap(lambda st: preconditioners(method, params, st))(stacked)
    return {k: v.unsqueeze(0) for k, v in preconditioners(method, params, {}).items()}


def precondition(g: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``g P`` on the im2col view, stacked or not: ``g`` ``([C,] out, ...)``, ``matrix`` ``([C or 1,] d, d)``."""
    rows = (g.shape[0], g.shape[1], -1) if matrix.dim() == 3 else (g.shape[0], -1)
    return torch.matmul(g.reshape(rows), matrix.to(g.dtype)).view_as(g)
