"""The batched trainer's side of the per-step method hooks: the round's layer preconditioners over the stacked
clients, and the step hooks (:mod:`cfl.engine.local.step_hooks`) run under ``vmap`` over the clients still training,
their running values written back into the stacked carry."""

from __future__ import annotations

import torch
from torch.func import vmap

from cfl.engine.hook_call import refuse
from cfl.engine.local import hooks
from cfl.engine.local.jobs import RoundMethods
from cfl.engine.local.stacking import Batch, client_rows, pad_samples, sample_counts
from cfl.engine.local.step_hooks import StepStage
from cfl.methods.base import Method
from cfl.methods.declarations import gives
from cfl.tensors import Params, State


def preconditioners_of(round_methods: RoundMethods, global_params: Params,
                       states: list[State]) -> dict[str, torch.Tensor]:
    """Each weight's ``round_terms`` preconditioner matrices over the stacked clients, multiplied in the methods'
    order."""
    total: dict[str, torch.Tensor] = {}
    for i, m in enumerate(round_methods.methods):
        if gives(m, "preconditioner"):
            for k, v in hooks.stacked_preconditioners(m, global_params, states[i]).items():
                total[k] = v if k not in total else torch.matmul(total[k], v)
    return total


StepData = tuple[tuple[torch.Tensor, ...], list[list[State]], list[State]]  # batch, raw states, stacked states


def drawn_samples(stage: StepStage, n: int, raw: list[list[State]], generators: list[torch.Generator],
                  x: torch.Tensor, carry: State, starts: list[dict[int, State]]
                  ) -> tuple[dict[int, list[int]], dict[int, tuple[torch.Tensor, ...]]]:
    """The step's step draws (``samples``' step part) of the ``n`` clients still training (``raw``: their states per
    method; ``carry``: the stacked running values, ``starts`` each client's own ``client_start`` carry, for the methods
    that keep running values): per sampling method, each client's count, and the draws padded to the client with the
    most as (x, y, task, weight, extra) (left out where no client drew any)."""
    reading = stage.reads_carry()
    draws = [stage.draw([st[c] for st in raw], generators[c], x,
                        {i: leaf_row(carry[i], c, starts[c][i], copy=False) for i in reading}) for c in range(n)]
    counts, drawn = {}, {}
    for i in stage.sampling:
        counts[i] = sample_counts([d[i] for d in draws])
        try:
            padded = pad_samples([d[i] for d in draws])
        except ValueError as err:  # extras named differently by two clients: the method's rule, named
            refuse(stage.methods[i], "samples", str(err))
        if padded is not None:
            drawn[i] = (padded.x, padded.y, padded.task, padded.weight, padded.extra)
    return counts, drawn


def loss_samples(methods: list[Method], counts: dict[int, list[int]],
                 drawn: dict[int, tuple[torch.Tensor, ...]]) -> dict[int, tuple[list[int], Batch | None]]:
    """Per method whose loss has an extra part (which gets them): its clients' counts and its padded draw (None:
    none)."""
    return {i: (c, Batch(*drawn[i]) if i in drawn else None) for i, c in counts.items()
            if gives(methods[i], "extra")}


def rewritten(stage: StepStage, s: int, n: int, params: Params, grads: Params, drawn: dict, carry: State,
              data: StepData, keys: torch.Tensor) -> tuple[Params, Params]:
    """The step hooks' gradients for the ``n`` clients still training (under ``vmap``) and the parameters before
    the step (for ``carry_step``); ``drawn``: the step's samples (:func:`drawn_samples`); ``keys``: the clients'
    :func:`cfl.engine.local.step_hooks.step_key` ``(C,)``."""
    batch, _, stacked = data
    before = {k: v.detach().clone() for k, v in params.items()} if stage.carry_stepping else params
    rows = client_rows(carry, n)
    with stage.watched("step_gradient", s, before, grads, batch, drawn, stacked, rows):
        new = vmap(lambda p, g, b, d, st, ca, ky: stage.rewrite(p, g, b, d, st, ca, s, ky),
                   randomness="different")(before, grads, batch, drawn, stacked, rows, keys[:n])
    return new, before


def carry_on(stage: StepStage, s: int, n: int, params: Params, grads: Params, before: Params, drawn: dict,
              carry: State, data: StepData, keys: torch.Tensor) -> None:
    """The running values of the ``n`` clients still training after the step, written into ``carry``'s rows."""
    batch, _, stacked = data
    moved = {k: params[k] - before[k] for k in params}
    rows = client_rows(carry, n)
    with stage.watched("carry_step", s, before, grads, batch, drawn, stacked, rows, moved):
        new = vmap(lambda p, g, b, d, st, ca, mv, ky: stage.carried(p, g, b, d, st, ca, s, mv, ky),
                   randomness="different")(before, grads, batch, drawn, stacked, rows, moved, keys[:n])
    write_rows(carry, new, n)


def write_rows(carry: State, new: State, n: int) -> None:
    for k, v in new.items():
        if isinstance(v, dict):
            write_rows(carry[k], v, n)
        else:
            carry[k][:n] = v


def leaf_row(v: State | torch.Tensor, c: int, like: State | torch.Tensor, copy: bool = True) -> State | torch.Tensor:
    """Client ``c``'s row of the stacked running values ``v``, each leaf cut back to the shape of ``like`` (its own
    ``client_start`` carry values: a ``ragged`` one was zero-padded to the widest client); ``copy`` False: views."""
    if isinstance(v, dict):
        return {k: leaf_row(u, c, like[k], copy) for k, u in v.items()}
    row = v[c]
    if row.shape != like.shape:
        row = row[tuple(slice(0, n) for n in like.shape)]
    return row.clone() if copy else row
