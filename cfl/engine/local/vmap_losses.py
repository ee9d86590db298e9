"""The vmap path's losses of a step (:mod:`cfl.engine.local.vmap`): per client, the weighted cross-entropy (or a
method's task loss) and the methods' extra losses (``Method.loss``'s parts), each a ``vmap``-ed one-client call. On
a model whose layers mix samples (BatchNorm on batch statistics: :func:`cfl.engine.local.stacking.couples_samples`)
padding would enter the statistics, so there each step groups its clients by real batch and replay sizes and runs
every group unpadded (:func:`size_groups`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import vmap

from cfl.engine.local import hooks
from cfl.engine.local.batched_round import StepBatch, with_replay
from cfl.engine.local.jobs import RoundMethods
from cfl.engine.local.stacking import Batch
from cfl.engine.local.step_hooks import task_loss_of
from cfl.methods.base import Method
from cfl.methods.declarations import gives
from cfl.methods.hook_types import Samples
from cfl.ops.losses import masked_cross_entropy, weighted_mean
from cfl.tensors import Params, State

#: client indices (None: all), batch width, replay widths (then those of the step draws ``loss``'s extra part takes)
Group = tuple[torch.Tensor | None, int, list[int]]


def size_groups(sizes: torch.Tensor, replay_counts: list[list[int]], width: int, coupled: bool,
                device: torch.device) -> list[Group]:
    """The step's client groups as ``(client indices or None for all, batch width, replay widths)``
    (``replay_counts`` may go on with the counts of the step draws an extra loss takes: widths of those as well).

    Samples independent of each other: one group at the padded widths. Coupled: one group per distinct
    real (batch size, replay sizes) among the clients' (CPU) ``sizes`` and ``replay_counts`` (per method,
    per client), each at those sizes, so every client's forward sees exactly its real samples, as in the
    sequential trainer; one group, unindexed, when all clients agree."""
    if not coupled:
        return [(None, width, [max(counts) for counts in replay_counts])]
    keys = [(int(b), *(counts[c] for counts in replay_counts)) for c, b in enumerate(sizes.tolist())]
    distinct = sorted(set(keys))
    if len(distinct) == 1:
        return [(None, distinct[0][0], list(distinct[0][1:]))]
    return [(torch.tensor([c for c, k in enumerate(keys) if k == key], device=device), key[0], list(key[1:]))
            for key in distinct]


def grouped_losses(groups: list[Group], data: StepBatch, extras: list[Batch | None], params: Params,
                   allowed: torch.Tensor | None, states: list[State], forward: Callable,
                   round_methods: RoundMethods, samples: dict[int, Batch | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per client (n,): the weighted cross-entropy of the step, and it plus the methods' extra losses; each
    group of :func:`size_groups` runs its own ``vmap``-ed forward on its clients' real samples. ``samples``:
    per method whose loss has an extra part, its step draw (their widths follow the replay
    widths in a group's)."""
    ce_parts, loss_parts = [], []
    for idx, width, widths in groups:
        def pick(v: torch.Tensor, idx: torch.Tensor | None = idx) -> torch.Tensor:
            return v if idx is None else v.index_select(0, idx)

        def cut(e: Batch | None, w: int) -> Batch | None:
            return None if e is None or w == 0 else Batch(*(pick(v)[:, :w] for v in (e.x, e.y, e.task, e.weight)),
                                                          {k: pick(v)[:, :w] for k, v in e.extra.items()})

        replays = [cut(e, w) for e, w in zip(extras, widths[:len(extras)], strict=True)]
        drawn = {i: cut(e, w) for (i, e), w in zip(samples.items(), widths[len(extras):], strict=True)}
        xb, yb, tb, wb = with_replay(tuple(pick(v)[:, :width] for v in data), replays)
        p = {k: pick(v) for k, v in params.items()}
        own = task_loss_of(round_methods.methods)
        if own is None:
            cross_entropy = weighted_mean(masked_cross_entropy(forward(p, xb, tb, idx), yb, None if allowed is None
                                                               else pick(allowed)), wb)
        else:  # the method's own per-sample loss in place of the cross-entropy
            own_losses = _own_losses(round_methods, own, p, forward(p, xb, tb, idx), (xb, yb, tb, wb),
                                     None if allowed is None else pick(allowed), client_rows_of(states[own], pick))
            cross_entropy = weighted_mean(hooks.differentiable(round_methods.methods[own], own_losses), wb)
        loss = cross_entropy
        for i, m in enumerate(round_methods.methods):
            if gives(m, "extra"):
                loss = loss + _extra_losses(m, round_methods.broadcasts[i],
                                            (p, xb, tb, wb, client_rows_of(states[i], pick)), drawn.get(i))
        ce_parts.append(cross_entropy)
        loss_parts.append(loss)
    if len(groups) == 1:
        return ce_parts[0], loss_parts[0]
    order = torch.cat([idx for idx, _, _ in groups])
    back = torch.empty_like(order)
    back[order] = torch.arange(len(order), device=order.device)
    return torch.cat(ce_parts)[back], torch.cat(loss_parts)[back]


def _extra_losses(method: Method, server: State, args: tuple, samples: Batch | None) -> torch.Tensor:
    """``method``'s extra loss per client ``(n,)`` under ``vmap``; ``args``: the stacked params, x, task, weight
    and state; ``samples``: the method's draw of the step, or None."""
    if samples is None:
        return vmap(lambda *a: hooks.extra_loss(method, *a[:4], server, a[4]), randomness="different")(*args)
    return vmap(lambda *a: hooks.extra_loss(method, *a[:4], server, a[4], Samples(*a[5:])),
                randomness="different")(*args, samples.x, samples.y, samples.task, samples.weight, samples.extra)


def _own_losses(round_methods: RoundMethods, i: int, params: Params, logits: torch.Tensor, data: StepBatch,
                allowed: torch.Tensor | None, state: State) -> torch.Tensor:
    """Method ``i``'s task loss per client and sample ``(n, B)``, under ``vmap``."""
    m, server = round_methods.methods[i], round_methods.broadcasts[i]
    x, y, t, w = data
    if allowed is None:
        return vmap(lambda p, lg, yy, xx, tt, ww, st: hooks.task_loss(m, p, lg, yy, xx, tt, ww, None, server, st),
                    randomness="different")(params, logits, y, x, t, w, state)
    return vmap(lambda p, lg, yy, xx, tt, ww, al, st: hooks.task_loss(m, p, lg, yy, xx, tt, ww, al, server, st),
                randomness="different")(params, logits, y, x, t, w, allowed, state)


def client_rows_of(state: State, pick: Callable[[torch.Tensor], torch.Tensor]) -> State:
    """``pick`` applied to every leaf of a stacked state."""
    return {k: client_rows_of(v, pick) if isinstance(v, dict) else pick(v) for k, v in state.items()}
