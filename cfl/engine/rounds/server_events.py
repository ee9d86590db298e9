"""The engine's calls of ``Method.server_event`` (cfl/methods/server_hooks.py) at the run's start and after each
round's server step, and the check of what it returns; the task ends' calls are cfl/engine/rounds/task_end.py's. Each
moment runs per method, in the run's order of methods (``method``, then ``plugins``)."""

from __future__ import annotations

from typing import Any

from torch import nn

from cfl.engine.hook_call import call
from cfl.engine.hook_rules import AFTER_SERVER_STEP, SERVER_CHANGE, check_some_params
from cfl.methods.base import Method, overrides
from cfl.methods.hook_guard import BrokenRule
from cfl.methods.server_hooks import ServerChange, ServerEvent, ServerMoment
from cfl.records.client_states import MethodState
from cfl.tensors import Params, State


def acts(method: Method, event: ServerMoment) -> bool:
    """Whether ``method``'s ``server_event`` runs at ``event`` (overridden, and ``event`` in its ``server_events``)."""
    return overrides(method, "server_event") and event in method.sends.server_events


def checked_change(result: Any, method: Method, event: ServerMoment, params: Params) -> ServerChange:
    """``server_event``'s result as its rule has it (None: no change), its new parameter values checked."""
    if result is None:
        return ServerChange()
    if not isinstance(result, ServerChange):
        raise BrokenRule(f"{SERVER_CHANGE}; got {type(result).__name__}")
    if result.backbone is not None and (event != "task_end" or not method.sends.changes_backbone):
        raise BrokenRule(f"{SERVER_CHANGE}; it returned a backbone change at '{event}'"
                         + ("" if event != "task_end" else " without declaring changes_backbone"))
    return ServerChange(check_some_params(result.params, params, AFTER_SERVER_STEP), result.backbone)


def at_start(methods: list[Method], states: list[MethodState], params: Params) -> Params:
    """``server_event("start")``: the server states before round 1 (SCAFFOLD's ``c``), from a copy of ``params``;
    the initial global parameters with the values each method set (CODA-P's first task's components)."""
    for m, st in zip(methods, states, strict=True):
        if acts(m, "start"):
            ctx = ServerEvent("start", st.server, 0, {k: v.clone() for k, v in params.items()})
            change = call(m, "server_event", ctx, use=lambda r, m=m, p=params: checked_change(r, m, "start", p),
                          server=st.server)
            params = {**params, **change.params}
    return params


def after_round(methods: list[Method], states: list[MethodState], uploads: list[dict[int, State]], model: nn.Module,
                params: Params, task: int) -> Params:
    """``server_event("round")`` after the round's server step, on the template ``model`` (eval mode): the global
    parameters with the values each method set (never written into in place)."""
    for m, st, sent in zip(methods, states, uploads, strict=True):
        if acts(m, "round"):
            model.eval()
            ctx = ServerEvent("round", st.server, task, params, sent, model)
            change = call(m, "server_event", ctx, use=lambda r, m=m, p=params: checked_change(r, m, "round", p),
                          read_only={"global_params": params}, server=st.server)
            params = {**params, **change.params}
    return params
