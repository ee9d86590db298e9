"""The contexts and results of the local step's ``loss`` and ``samples`` hooks and of ``client_end``
(``docs/plugins.md``); the parts a method gives are declared in ``computes=Computes(losses=..., draws=...)``
(cfl/methods/declarations.py).

The engine calls ``loss`` once per declared part of a step (``ctx.part``: ``"task"``, the per-sample loss in place
of the cross-entropy, where the forward's logits are; ``"extra"``, the per-sample loss added, after it) and
``samples`` once per declared part (``"replay"``, before the step's forward; ``"step"``, after every method's replay
draw and before the loss): the calls keep the moments, the order of the loss terms' sum and the order of the
client generator's draws, method after method. A result names its part; one for a part the method did not declare,
or other than the one asked for, is a broken rule of the hook (:mod:`cfl.engine.hook_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cfl.methods.declarations import DrawPart, LossPart
from cfl.methods.hook_types import ClientData, Event, LocalTraining, Samples
from cfl.tensors import Params, State


@dataclass
class LossContext:
    """One client's step, for one part of its ``loss`` (a pure tensor function under ``vmap``)."""

    part: LossPart  # which part the engine asks for
    params: Params  # the client's parameters at the step
    x: torch.Tensor  # the step's inputs (B, ...), replay samples appended
    task: torch.Tensor  # (B,) task ids
    weight: torch.Tensor  # (B,) 1 per real sample, 0 for padding
    server: State  # the method's broadcast of the round ("task_start" keys included)
    state: State  # the client's state (read only)
    samples: Samples | None = None  # "extra": this method's step draw of the step (weight 0 marks padding), or None
    logits: torch.Tensor | None = None  # "task": the forward's (B, K) logits of x at params
    y: torch.Tensor | None = None  # "task": the labels (B,)
    allowed: torch.Tensor | None = None  # "task": (K,) the classes the loss may use (class-incremental), or None


@dataclass
class LossTerms:
    """What ``loss`` returns: the asked part's per-sample loss ``(B,)`` (the engine averages it over the real
    samples), the other None."""

    task: torch.Tensor | None = None
    extra: torch.Tensor | None = None


@dataclass
class SamplesContext:
    """One client's step, for one part of its ``samples`` (outside ``vmap``: Python on values is fine)."""

    part: DrawPart  # which part the engine asks for
    state: State  # the client's state
    generator: torch.Generator  # the client's own (seeded per client and round): draw from it, in order
    server: State  # the method's broadcast of the round ("task_start" keys included)
    carry: State  # "step": the client's running values before the step (client_start's carry, then carry_step's), or {}


@dataclass
class Draw:
    """What ``samples`` returns: ``replay`` samples join the step's batch and are trained on (no extras); ``step``
    samples reach the step hooks (``step.samples``) and the loss's extra part (``ctx.samples``), not trained on.
    The asked part, the other None; None or a part left None: no samples this step."""

    replay: Samples | None = None
    step: Samples | None = None


@dataclass
class ClientEndContext:
    """A client's end of a round (``params``: its trained model) or of a task (the final global model).

    ``params`` of a round are views of the round's stacked client models, whose memory the server reuses
    afterwards: keep computed tensors or ``.clone()``, never the views themselves."""

    event: Event  # "round" or "task_end"
    model: nn.Module  # the template model, in eval mode
    params: Params
    data: ClientData  # the client's data of the task
    state: State  # the client's state, updated in place
    server: State  # the method's broadcast of the event
    generator: torch.Generator  # the client's own for this call
    training: LocalTraining | None = None  # "round": the round's global model, local steps and lr; None at a task end
