"""The step hooks in local training (:class:`cfl.methods.base.Step`): one client's code, run on one client by the
sequential trainer and under ``torch.func.vmap`` over the clients still training by the batched one.

Each local step, before the step's loss (after every method's replay draw): every method's step draw (``samples``'
step part, outside ``vmap``, from the client's own generator, padded with weight 0), which the method's loss gets
as ``ctx.samples`` at its extra part; after the step's loss gradient, the methods' ``step_gradient`` in the run's
method order (each sees the gradient as the previous one left it); the optimiser takes the result (weight decay,
GPM's projection, moments). After the optimiser's update, each method's ``carry_step`` gets the step (``grads``:
the gradient the optimiser took) and ``step.moved``, the update. A round starts each client's running values from
``client_start``'s carry; they come back with the client's outcome, and the round engine writes them into the
client's state (kept clients only) before ``client_end("round")``. A step draw gets the client's running values
before the step (``ctx.carry``) (a memory filled during the round). Every hook call gets ``step.random``,
the client's own counter-based random numbers (:class:`cfl.ops.counter_random.StepRandom`), keyed by the client's
round seed (:func:`step_key`), the method, the hook and the step: usable under ``vmap``, the same on both trainers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call

from cfl.engine.hook_call import blamed, takes, unwritten
from cfl.engine.hook_rules import check_carries
from cfl.engine.local import hooks
from cfl.engine.local.jobs import ClientJob, derive_seed
from cfl.engine.local.precision import autocast, to_float
from cfl.engine.local.stacking import stack_states
from cfl.methods.base import Method, overrides
from cfl.methods.declarations import gives
from cfl.methods.hook_guard import STEP_HOOKS  # noqa: F401 - the engine's name for them
from cfl.methods.hook_types import Samples, Step
from cfl.ops.counter_random import StepRandom, key_of
from cfl.ops.losses import masked_cross_entropy, weighted_mean
from cfl.tensors import Params, State

#: the hooks of a local step, besides the loss's (penalty, loss, replay draws) and the optimiser's projection

SampleBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # x, y, task, weight
#: a step draw (``samples``' step part): x, y, task, weight and the named per-sample extras
DrawBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]
_HOOK_IDS = {"step_gradient": 0, "carry_step": 1}


def step_key(job: ClientJob, device: torch.device) -> torch.Tensor:
    """The client's key of :class:`StepRandom` for the round (0-dim int64): from its round seed (run seed, task,
    round, client), so a resumed run draws the same numbers."""
    return torch.tensor(key_of(derive_seed(job.seed, 0x57E9)), dtype=torch.long, device=device)


def task_loss_of(methods: list[Method]) -> int | None:
    """The index of the method that replaces the cross-entropy (its loss's task part; one at most, checked with the
    config), or None."""
    return next((i for i, m in enumerate(methods) if gives(m, "task")), None)


def takes_steps(method: Method) -> bool:
    """Whether ``method`` overrides a step hook or declares a step part (``samples.step``, ``client_start.carry``)."""
    return any(takes(method, hook) for hook in STEP_HOOKS)


def carries(method: Method) -> bool:
    return gives(method, "carry") or overrides(method, "carry_step")


def gradient_function(model: nn.Module, precision: int | str,
                      device: torch.device) -> Callable[[Params], Callable[..., Params]]:
    """``at(params)(x, y, task, weight=None)``: the gradient at ``params`` of the weighted mean cross-entropy of
    the samples (all classes of their heads), with the model's buffers and the run's precision. BatchNorm running
    statistics, if any, are read from copies: these extra forwards (in training mode) move no statistics."""
    buffers = dict(model.named_buffers())

    def loss(p: Params, x: torch.Tensor, y: torch.Tensor, task: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        with autocast(precision, device):
            logits = to_float(functional_call(model, (p, {k: v.clone() for k, v in buffers.items()}), (x, task)))
        return weighted_mean(masked_cross_entropy(logits, y, None), weight)

    grad = torch.func.grad(loss)

    def at(params: Params) -> Callable[..., Params]:
        def gradient(x: torch.Tensor, y: torch.Tensor, task: torch.Tensor,
                     weight: torch.Tensor | None = None) -> Params:
            if weight is None:
                weight = torch.ones(y.shape, dtype=torch.get_default_dtype(), device=y.device)
            return grad({k: v.detach() for k, v in params.items()}, x, y, task, weight)
        return gradient

    return at


class StepStage:
    """The run's step hooks for one round: the per-client functions both trainers call."""

    def __init__(self, methods: list[Method], broadcasts: list[State], global_params: Params, lr: float,
                 gradient_at: Callable[[Params], Callable[..., Params]]) -> None:
        self.methods, self.broadcasts, self.global_params, self.lr = methods, broadcasts, global_params, lr
        self.gradient_at = gradient_at
        self.sampling = [i for i, m in enumerate(methods) if gives(m, "step")]
        self.rewriting = [i for i, m in enumerate(methods) if overrides(m, "step_gradient")]
        self.carrying = [i for i, m in enumerate(methods) if carries(m)]
        self.carry_stepping = [i for i in self.carrying if overrides(methods[i], "carry_step")]

    @staticmethod
    def of(methods: list[Method], broadcasts: list[State], global_params: Params, lr: float, model: nn.Module,
           precision: int | str, device: torch.device) -> StepStage | None:
        """The stage for a round, or None when no method takes step hooks."""
        if not any(takes_steps(m) for m in methods):
            return None
        return StepStage(methods, broadcasts, global_params, lr, gradient_function(model, precision, device))

    # ---- outside vmap, per client ----
    def start(self, states: list[State]) -> dict[int, State]:
        """One client's running values at the round's start (``states``: its state per method)."""
        return {i: hooks.carry_start(self.methods[i], self.global_params, states[i], self.broadcasts[i])
                for i in self.carrying}

    def stacked(self, starts: list[dict[int, State]]) -> dict[int, State]:
        """The clients' running values (``starts``: one :meth:`start` per client) stacked over them per method, a
        leaf the method declares ``ragged`` zero-padded to the widest client; keys or shapes that differ otherwise
        are refused, naming the method and ``client_start``."""
        out = {}
        for i in self.carrying:
            method = self.methods[i]
            blamed(method, "client_start", check_carries, [s[i] for s in starts], method.computes.ragged)
            out[i] = stack_states([s[i] for s in starts], method.computes.ragged)
        return out

    def draw(self, states: list[State], generator: torch.Generator, like: torch.Tensor,
             carry: dict[int, State] | None = None) -> dict[int, Samples | None]:
        """One client's step draw per sampling method (``carry``: its running values per method)."""
        carry = carry or {}
        return {i: hooks.step_samples(self.methods[i], states[i], generator, like, self.broadcasts[i], carry.get(i))
                for i in self.sampling}

    def reads_carry(self) -> list[int]:
        """The sampling methods that keep running values (their step draws get them)."""
        return [i for i in self.sampling if i in self.carrying]

    def watched(self, hook: str, index: int, params: Params, grads: Params, batch: SampleBatch,
                samples: dict[int, SampleBatch], states: list[State], carry: dict[int, State],
                moved: Params | None = None) -> contextlib.AbstractContextManager:
        """At a round's first step (``index`` 0), a context refusing in-place writes of the methods' ``hook``
        (``step_gradient`` or ``carry_step``) into the step's arguments (:class:`cfl.engine.hook_call.unwritten`);
        outside ``vmap`` (version counters are read on the tensors it maps over). Later steps: nothing."""
        which = self.rewriting if hook == "step_gradient" else self.carry_stepping
        if index != 0 or not which:
            return contextlib.nullcontext()
        x, y, task, weight = batch
        stack = contextlib.ExitStack()
        for i in which:
            stack.enter_context(unwritten(self.methods[i], hook, {
                "step.params": params, "step.grads": grads, "step.x": x, "step.y": y, "step.task": task,
                "step.weight": weight, "step.samples": samples.get(i), "step.global_params": self.global_params,
                "step.server": self.broadcasts[i], "step.state": states[i], "step.carry": carry.get(i),
                **({} if moved is None else {"step.moved": moved})}))
        return stack

    # ---- one client's step (the batched trainer vmaps these) ----
    def _step(self, i: int, params: Params, grads: Params, batch: SampleBatch, samples: dict[int, DrawBatch],
              states: list[State], carry: dict[int, State], index: int, key: torch.Tensor, hook: str,
              moved: Params | None = None) -> Step:
        x, y, task, weight = batch
        drawn = samples.get(i)
        random = StepRandom(key, (index << 8) | (i << 1) | _HOOK_IDS[hook])
        return Step(params, grads, x, y, task, weight, None if drawn is None else Samples(*drawn),
                    self.global_params, self.broadcasts[i], states[i], carry.get(i, {}), self.lr, index,
                    self.gradient_at(params), random, moved)

    def rewrite(self, params: Params, grads: Params, batch: SampleBatch, samples: dict[int, DrawBatch],
                states: list[State], carry: dict[int, State], index: int, key: torch.Tensor) -> Params:
        """The step's gradient after every method's ``step_gradient`` (``key``: the client's :func:`step_key`)."""
        for i in self.rewriting:
            grads = hooks.step_gradient(self.methods[i], self._step(i, params, grads, batch, samples, states, carry,
                                                                    index, key, "step_gradient"))
        return grads

    def carried(self, params: Params, grads: Params, batch: SampleBatch, samples: dict[int, DrawBatch],
                states: list[State], carry: dict[int, State], index: int, moved: Params,
                key: torch.Tensor) -> dict[int, State]:
        """The running values after the step (``params``: before it; ``grads``: the gradient it took)."""
        out = dict(carry)
        for i in self.carry_stepping:
            out[i] = hooks.carry_step(self.methods[i], self._step(i, params, grads, batch, samples, states, carry,
                                                                  index, key, "carry_step", moved))
        return out


def as_batch(samples: Samples | None, device: torch.device) -> DrawBatch | None:
    """One client's drawn samples as (x, y, task, weight, extra), every sample real."""
    if samples is None:
        return None
    return samples.x, samples.y, samples.task, torch.ones(samples.y.shape, device=device), dict(samples.extra)
