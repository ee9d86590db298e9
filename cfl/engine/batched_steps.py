"""The batched trainer's side of the per-step method hooks: the round's layer preconditioners over the stacked
clients, and the step hooks (:mod:`cfl.engine.step_hooks`) run under ``vmap`` over the clients still training,
their running values written back into the stacked carry."""

from __future__ import annotations

import torch
from torch.func import vmap

from cfl.engine import hooks
from cfl.engine.jobs import Plugins
from cfl.engine.stacking import client_rows, pad_samples
from cfl.engine.step_hooks import StepStage
from cfl.methods.base import overrides
from cfl.tensors import Params, State


def preconditioners_of(plugins: Plugins, global_params: Params, states: list[State]) -> dict[str, torch.Tensor]:
    """Each weight's ``layer_preconditioner`` matrices over the stacked clients, multiplied in the methods' order."""
    total: dict[str, torch.Tensor] = {}
    for i, m in enumerate(plugins.methods):
        if overrides(m, "layer_preconditioner"):
            for k, v in hooks.stacked_preconditioners(m, global_params, states[i]).items():
                total[k] = v if k not in total else torch.matmul(total[k], v)
    return total


StepData = tuple[tuple[torch.Tensor, ...], list[list[State]], list[State]]  # batch, raw states, stacked states


def rewritten(stage: StepStage, s: int, n: int, params: Params, grads: Params, generators: list[torch.Generator],
               x: torch.Tensor, carry: State, data: StepData) -> tuple[Params, Params, dict]:
    """The step hooks' gradients for the ``n`` clients still training (under ``vmap``), the parameters before
    the step (for ``carry_step``) and the step's drawn samples."""
    batch, raw, stacked = data
    draws = [stage.draw([st[c] for st in raw], generators[c], x) for c in range(n)]
    drawn = {}
    for i in stage.sampling:
        padded = pad_samples([d[i] for d in draws])
        if padded is not None:
            drawn[i] = (padded.x, padded.y, padded.task, padded.weight)
    before = {k: v.detach().clone() for k, v in params.items()} if stage.carry_stepping else params
    rows = client_rows(carry, n)
    new = vmap(lambda p, g, b, d, st, ca: stage.rewrite(p, g, b, d, st, ca, s),
               randomness="different")(before, grads, batch, drawn, stacked, rows)
    return new, before, drawn


def carry_on(stage: StepStage, s: int, n: int, params: Params, grads: Params, before: Params, drawn: dict,
              carry: State, data: StepData) -> None:
    """The running values of the ``n`` clients still training after the step, written into ``carry``'s rows."""
    batch, _, stacked = data
    moved = {k: params[k] - before[k] for k in params}
    new = vmap(lambda p, g, b, d, st, ca, mv: stage.carried(p, g, b, d, st, ca, s, mv),
               randomness="different")(before, grads, batch, drawn, stacked, client_rows(carry, n), moved)
    write_rows(carry, new, n)


def write_rows(carry: State, new: State, n: int) -> None:
    for k, v in new.items():
        if isinstance(v, dict):
            write_rows(carry[k], v, n)
        else:
            carry[k][:n] = v


def leaf_row(v: State | torch.Tensor, c: int) -> State | torch.Tensor:
    return {k: leaf_row(u, c) for k, u in v.items()} if isinstance(v, dict) else v[c].clone()
