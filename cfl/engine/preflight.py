"""A dry call of every method's per-step and server hooks before the run writes anything: a hook that raises
or returns the wrong shapes, keys or types on a fresh client is refused (exit code 2) instead of stopping the
run at its first round. Each hook is called once, as the engine calls it, on the first two training samples,
an empty client state and copies of the server state; torch's generators are restored afterwards, so the run
draws what it would have drawn. ``client_end`` and ``server_end`` are not called here (they need a trained
round): their failures stop the run with exit code 3 and its checkpoint kept."""

from __future__ import annotations

import copy

import torch
from torch.func import functional_call

from cfl.engine import hooks
from cfl.engine.hook_rules import (
    AFTER_SERVER_STEP,
    check_bytes,
    check_client_start,
    check_client_upload,
    check_server_aggregate,
    check_some_params,
)
from cfl.engine.runner import Runner, broadcast_of
from cfl.engine.server import transformed, updated
from cfl.engine.step_hooks import StepStage, as_batch, gradient_function, takes_steps
from cfl.methods.base import Method, Samples, overrides
from cfl.methods.hook_guard import guarded
from cfl.tensors import Params, State


def dry_run_hooks(runner: Runner) -> None:
    """Call each overridden per-step and server hook of ``runner``'s methods once; raise ``HookError``."""
    data = runner.stream.tasks[0]
    x, y = data.train_x[:2], data.train_y[:2]
    task = torch.zeros_like(y)
    weight = torch.ones(len(y), device=x.device)
    params = runner.params
    devices = [runner.device] if runner.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        for m, st in zip(runner.methods, runner.states, strict=True):
            server = copy.deepcopy(st.server)
            broadcast = {**broadcast_of(m, "round", server), **broadcast_of(m, "task_start", server)}
            params, state = _dry_start(runner, m, broadcast)
            if overrides(m, "penalty"):
                hooks.penalty_loss(m, params, params, broadcast, state)
            if overrides(m, "task_loss"):
                logits = functional_call(runner.model, params, (x, task))
                hooks.task_loss(m, params, logits, y, x, task, weight, None, broadcast, state)
            stage = StepStage([m], [broadcast], params, runner.hyper.lr,
                              gradient_function(runner.model, runner.hyper.precision, runner.device))
            drawn = {i: as_batch(d, runner.device) for i, d in stage.draw([state], torch.Generator().manual_seed(0),
                                                                          x).items() if d is not None}
            if overrides(m, "extra_loss"):
                hooks.extra_loss(m, params, x, task, weight, broadcast, state, Samples(*drawn[0]) if drawn else None)
            if overrides(m, "gradient_projection"):
                hooks.projected(m, {k: torch.zeros_like(v) for k, v in params.items()}, state)
            if overrides(m, "replay"):
                hooks.replayed(m, state, torch.Generator().manual_seed(0), x, broadcast)
            if takes_steps(m):
                _dry_step(runner, stage, drawn, (x, y, task, weight))
            _dry_upload(runner, m, params, state)
            params = runner.params
            delta = {k: torch.zeros_like(v) for k, v in params.items()}
            updated(m, params, delta, server, runner.cfg.server_lr)
            if overrides(m, "transform_update"):
                transformed(m, delta, server, 0, params)
            if overrides(m, "after_server_step"):
                with guarded(m, "after_server_step"):
                    check_some_params(m.after_server_step(runner.model, params, server, 0), params,
                                      AFTER_SERVER_STEP)


def _dry_step(runner: Runner, stage: StepStage, drawn: dict, batch: tuple[torch.Tensor, ...]) -> None:
    """One step of a method's step hooks (``stage``, ``drawn``: its ``step_samples`` draw) on a fresh client: the
    loss gradient and the update taken as zeros."""
    params = runner.params
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    carry = stage.start([{}])
    grads = stage.rewrite(params, zeros, batch, drawn, [{}], carry, 0)
    stage.carried(params, grads, batch, drawn, [{}], carry, 0, zeros)


def _dry_start(runner: Runner, method: Method, broadcast: State) -> tuple[Params, State]:
    """A fresh client's starting parameters and state after ``method.client_start`` (the global model and ``{}``
    where it has none)."""
    state: State = {}
    if not overrides(method, "client_start"):
        return runner.params, state
    with guarded(method, "client_start"):
        start = method.client_start(dict(runner.params), state, broadcast, 0)
        return check_client_start(start, runner.params), state


def _dry_upload(runner: Runner, method: Method, params: Params, state: State) -> None:
    """``client_upload``, ``upload_bytes`` and ``server_aggregate`` on one fresh client's starting parameters."""
    if not overrides(method, "client_upload"):
        return
    local = runner.client_params.local_names
    with guarded(method, "client_upload"):
        sent, info = check_client_upload(method.client_upload(dict(params), state), runner.params, local)
    with guarded(method, "upload_bytes"):
        check_bytes(method.upload_bytes(sent, info))
    stacked = ({k: v.unsqueeze(0) for k, v in sent.items()}, {k: v.unsqueeze(0) for k, v in info.items()})
    with guarded(method, "server_aggregate"):
        check_server_aggregate(method.server_aggregate(*stacked), sent, runner.params)
