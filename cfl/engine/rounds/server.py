"""The server: the global model's parameters and the server step of every round.

The step is: refuse non-finite client updates (or drop them, ``on_nonfinite: skip_client``), aggregate
the kept clients' updates ``w_c - w`` (:mod:`cfl.ops.aggregate`), apply the first method's
``server_update`` (else ``server_lr * delta``; FedOpt, Reddi et al. 2021), times GMA's mask if any
(Tenison et al. 2023), then every method's ``transform_update`` (FOT projects the step actually taken),
and refuse a global model that the step made non-finite.
"""

from __future__ import annotations

import warnings

import torch

from cfl.config.keys import Config
from cfl.engine.hook_call import call, finite_checks
from cfl.engine.hook_rules import SERVER_UPDATE, TRANSFORM, check_params
from cfl.engine.local.jobs import ClientOutcome
from cfl.engine.local.penalty_stiffness import stiffness_hint
from cfl.methods.base import Method, overrides
from cfl.methods.server_hooks import ServerUpdate, TransformUpdate
from cfl.ops.aggregate import aggregate
from cfl.records.client_states import MethodState
from cfl.tensors import Params, State


class NonFiniteError(RuntimeError):
    """A client produced a NaN/inf loss or update, or the server step a NaN/inf global model."""

    clients: list[int] = []  # noqa: RUF012 -- the clients a non-finite round stopped on (set where raised)


def client_deltas(trained: Params, global_params: Params, keep: torch.Tensor) -> Params:
    """The kept clients' updates ``w_c - w``, computed in place in ``trained`` when every client is kept
    (no fresh (C, ...) tensors: at 64 MLP clients each costs ~160 MB of new pages a round)."""
    if bool(keep.all()):
        return {k: trained[k].sub_(v) for k, v in global_params.items()}
    return {k: trained[k][keep] - v for k, v in global_params.items()}


class Server:
    """Holds the global parameters and applies the aggregated client updates to them."""

    def __init__(self, cfg: Config, params: Params, methods: list[Method], states: list[MethodState],
                 buffers: Params | None = None) -> None:
        self.cfg, self.params, self.methods, self.states = cfg, params, methods, states
        #: the global BatchNorm running statistics (``{}`` without any), replaced each round by the runner
        #: (:mod:`cfl.engine.rounds.model_buffers`)
        self.buffers: Params = buffers or {}

    def accept(self, trained: Params, outcomes: list[ClientOutcome], task: int, rnd: int,
               broadcasts: list[State]) -> torch.Tensor:
        """(C,) bool: the clients whose loss and update are finite; a non-finite one is refused (naming a quadratic
        penalty too stiff for the clients' SGD steps where one is: :mod:`cfl.engine.local.penalty_stiffness`, with the
        round's ``broadcasts``), or dropped with a warning under ``on_nonfinite: skip_client`` while at least one
        client is left."""
        finite = torch.tensor([o.finite for o in outcomes], device=next(iter(self.params.values())).device)
        for v in trained.values():  # min and max are finite iff every entry is (NaN propagates); one pass
            low, high = torch.aminmax(v.flatten(1), dim=1)
            finite &= torch.isfinite(low) & torch.isfinite(high)
        if bool(finite.all()):
            return finite
        bad = [o.cid for o, ok in zip(outcomes, finite.tolist(), strict=True) if not ok]
        where = f"task {task} (0-based), round {rnd + 1} of the task, client(s) {bad}"
        if self.cfg.on_nonfinite == "skip_client" and bool(finite.any()):
            warnings.warn(f"non-finite loss or update at {where}: update dropped", stacklevel=2)
            return finite
        hint = stiffness_hint(self.cfg, self.methods, self.states, broadcasts, self.params, bad)
        err = NonFiniteError(f"non-finite loss or update at {where}; lower lr (now {self.cfg.lr}) or check "
                             f"the method's parameters" + (f". {hint}" if hint else ""))
        err.clients = bad
        raise err

    def step(self, trained: Params, keep: torch.Tensor, weights: torch.Tensor, task: int, rnd: int,
             local: frozenset[str] = frozenset(), combined: Params | None = None) -> None:
        """Aggregate the kept rows of ``trained`` (used up: their memory holds the deltas) with ``weights``
        and replace the global parameters by the result of the server step. ``local``: parameters kept per
        client, which the global model keeps as they are; ``combined``: a method's ``server_aggregate`` of some
        parameters, whose update is ``combined - w`` in place of the weighted mean's."""
        deltas = client_deltas(trained, self.params, keep)
        delta, mask = aggregate(self.cfg.aggregator.name, deltas, weights, self.cfg.aggregator.tau)
        for k, v in (combined or {}).items():
            delta[k] = v - self.params[k]
        new = self.apply(delta, mask, task)
        for k in local:
            new[k] = self.params[k]
        try:
            self.params = self.check_step(new, task, rnd)
        except NonFiniteError:  # a server hook that made the NaN is named (the step again, with its results checked)
            with finite_checks():
                self.apply(delta, mask, task)
            raise

    def apply(self, delta: Params, mask: Params | None, task: int) -> Params:
        """The new global parameters: the first method's ``server_update`` (else ``server_lr * delta``), times
        GMA's mask if any, then every method's ``transform_update`` (FOT projects the step actually taken)."""
        lr = self.cfg.server_lr
        new = next((p for m, st in zip(self.methods, self.states, strict=True)
                    if (p := updated(m, self.params, delta, st.server, lr)) is not None), None)
        step = {k: new[k] - self.params[k] for k in self.params} if new is not None else \
            {k: lr * delta[k] for k in self.params}
        if mask is not None:
            step = {k: mask[k] * step[k] for k in self.params}
        for m, st in zip(self.methods, self.states, strict=True):
            step = transformed(m, step, st.server, task, self.params)
        return {k: self.params[k] + step[k] for k in self.params}

    def check_step(self, new: Params, task: int, rnd: int) -> Params:
        """Refuse a global model made non-finite by the server step (every client update was finite)."""
        bad = [k for k, v in new.items() if not bool(torch.isfinite(v).all())]
        if not bad:
            return new
        server = [m.name for m in self.methods if overrides(m, "server_update")]
        raise NonFiniteError(
            f"non-finite global model after the server step at task {task} (0-based), round {rnd + 1} of the task "
            f"(parameter(s) {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}; every client update was finite): "
            f"lower server_lr (now {self.cfg.server_lr})"
            + (f" or check the server optimiser of {', '.join(server)}" if server else "")
            + f", or the aggregator ({self.cfg.aggregator.name})")


def updated(method: Method, params: Params, delta: Params, server: State, lr: float) -> Params | None:
    """``method.server_update``: the new global parameters, or None for the default step."""
    return call(method, "server_update", ServerUpdate(params, delta, server, lr),
                use=lambda new: None if new is None else check_params(new, params, SERVER_UPDATE),
                finite={"global_params": params, "delta": delta}, default=None)


def transformed(method: Method, step: Params, server: State, task: int, params: Params) -> Params:
    """``method.transform_update`` of the server ``step`` (the step of each of ``params``)."""
    return call(method, "transform_update", TransformUpdate(step, server, task),
                use=lambda new: check_params(new, params, TRANSFORM),
                finite={"delta": step})
