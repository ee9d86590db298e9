"""A client's round start and the terms that shape its local steps: the context and result of ``client_start``
(:class:`ClientRoundStart` -> :class:`ClientStart`) and of ``round_terms`` (:class:`ClientRound` ->
:class:`RoundTerms`), their parts (:data:`StartPart`, :data:`TermPart`), which a method declares in
``computes=Computes(starts=..., terms=...)``: the engine asks each part at its own moment (``ctx.part``) of the methods
that declare it only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import torch

from cfl.methods.declarations import StartPart, TermPart
from cfl.methods.hook_guard import BrokenRule
from cfl.methods.hook_types import Linear, Quadratic
from cfl.tensors import Params, State


@dataclass
class ClientRoundStart:
    """What ``client_start`` sees of one client at the moment of ``part`` (a field another part has is None)."""

    part: StartPart
    server: State | None = None  # the method's broadcast of the round (every part)
    state: State | None = None  # params: the client's state, may be updated in place; carry: read only
    params: Params | None = None  # params: the global model with the client's local parameters (earlier starts')
    task: int | None = None  # params: the task, 0-based
    num_samples: int | None = None  # steps: the client's samples of the task
    global_params: Params | None = None  # carry: the round's global model


@dataclass
class ClientStart:
    """``client_start``'s result; the engine takes the field of the part it asked for (None: the default)."""

    #: params: the client's starting parameters, every parameter shaped as ``ctx.params``
    params: Params | None = None
    #: steps: at most this many local steps in each epoch (its first batches); None: all its batches
    steps: int | None = None
    #: carry: the running values the client's local training starts with (tensors of fixed shapes); None: ``{}``
    carry: State | None = None


@dataclass
class ClientRound:
    """What ``round_terms`` sees of one client, asked for ``part`` (a method giving several may compute it only)."""

    part: TermPart
    state: State  # the client's state as the round began (``{}``: none; under ``vmap``: one client's slice)
    global_params: Params | None = None  # penalty: the round's global model (the anchor), else None
    server: State | None = None  # penalty: the method's broadcast of the round, else None


@dataclass
class RoundTerms:
    """``round_terms``' result: the engine takes the field of the part it asked for (None or absent: none)."""

    #: per parameter name, the Quadratic / Linear terms added to every local step's loss
    penalty: dict[str, Quadratic | Linear] | None = None
    #: per weight, a matrix ``P (d, d)``: every local step's gradient ``g <- g P`` on the im2col view
    preconditioner: dict[str, torch.Tensor] | None = None
    #: per parameter, an orthonormal basis ``(d, k)``: ``g <- g - (g M) M^T`` on the im2col view, after weight decay
    projection: dict[str, torch.Tensor] | None = None


def part_of(result: Any, part: str, declared: tuple[str, ...], kind: type) -> Any:
    """The ``part`` field of a hook's ``result`` (a ``kind`` or None), refusing a result of another type or one
    that fills a part the method does not declare."""
    if result is None:
        return None
    if not isinstance(result, kind):
        raise BrokenRule(f"must return None or {kind.__name__}(...); got {type(result).__name__}")
    extra = [p for p in get_args(StartPart if kind is ClientStart else TermPart)
             if p not in declared and getattr(result, p) is not None]
    if extra:
        raise BrokenRule(f"gives {extra} undeclared: list every part it gives in its declaration ({list(declared)})")
    return getattr(result, part)
