"""A dry call of every method's per-step and server hooks before the run writes anything: a hook that raises
or returns the wrong shapes, keys or types on a fresh client is refused (exit code 2) instead of stopping the
run at its first round. Each hook is called once, as the engine calls it, on the first two training samples,
an empty client state and copies of the server state, its read-only arguments watched for in-place writes
(:class:`cfl.engine.hook_call.unwritten`); then a dry round trains two fresh clients one local step each through the
run's own trainer, so the batched engine runs the hooks it maps over clients (``VMAPPED_HOOKS``) under
``torch.func.vmap`` over both, where ``.item()`` or a Python branch on a tensor fails. torch's generators are
restored afterwards, so the run draws what it would have drawn. ``client_end`` and ``server_event`` at the task
ends are not called here (they need a trained task), ``server_event("round")`` only on a round without uploads:
their failures stop the run with exit code 3 and its checkpoint kept."""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch.func import functional_call

from cfl.engine.hook_call import call, unwritten
from cfl.engine.hook_rules import (
    check_client_start,
    check_client_upload,
    check_server_aggregate,
)
from cfl.engine.local import hooks
from cfl.engine.local.batched import train_batched
from cfl.engine.local.jobs import ClientJob, RoundMethods, limit_epochs
from cfl.engine.local.path import trainer_kind
from cfl.engine.local.sequential import train_sequential
from cfl.engine.local.step_hooks import StepStage, as_batch, gradient_function, takes_steps
from cfl.engine.rounds.runner import Runner
from cfl.engine.rounds.server import transformed, updated
from cfl.engine.rounds.server_events import acts, checked_change
from cfl.engine.rounds.server_state import broadcast_of, counted
from cfl.methods.base import Method, overrides
from cfl.methods.declarations import gives
from cfl.methods.hook_types import Samples
from cfl.methods.server_hooks import ServerEvent
from cfl.methods.traffic_hooks import Payload, StackedUploads, TrainedClient
from cfl.models.buffers import load_global_model
from cfl.records.client_states import ClientStates, MethodState
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
            read = {"global_params": params, "server": broadcast, "state": state}
            if gives(m, "penalty"):
                with unwritten(m, "round_terms", read):
                    hooks.penalty_loss(m, params, params, broadcast, state)
            if gives(m, "task"):
                logits = functional_call(runner.model, params, (x, task))
                with unwritten(m, "loss", {**read, "logits": logits, "x": x, "y": y}):
                    hooks.task_loss(m, params, logits, y, x, task, weight, None, broadcast, state)
            if gives(m, "preconditioner"):
                with unwritten(m, "round_terms", read):
                    hooks.preconditioners(m, params, state)
            stage = StepStage([m], [broadcast], params, runner.hyper.lr,
                              gradient_function(runner.model, runner.hyper.precision, runner.device))
            carry = stage.start([state]) if stage.reads_carry() else {}
            drawn = {i: as_batch(d, runner.device) for i, d in stage.draw([state], torch.Generator().manual_seed(0),
                                                                          x, carry).items() if d is not None}
            if gives(m, "extra"):
                with unwritten(m, "loss", {**read, "x": x}):
                    hooks.extra_loss(m, params, x, task, weight, broadcast, state,
                                     Samples(*drawn[0]) if drawn else None)
            if gives(m, "projection"):
                with unwritten(m, "round_terms", read):
                    hooks.projected(m, {k: torch.zeros_like(v) for k, v in params.items()}, state)
            if gives(m, "replay"):
                with unwritten(m, "samples", read):
                    hooks.replayed(m, state, torch.Generator().manual_seed(0), x, broadcast)
            if takes_steps(m):
                _dry_step(runner, stage, drawn, (x, y, task, weight))
            _dry_upload(runner, m, params, state)
            params = runner.params
            delta = {k: torch.zeros_like(v) for k, v in params.items()}
            with unwritten(m, "server_update", {"global_params": params, "delta": delta}):
                updated(m, params, delta, server, runner.cfg.server_lr)
            if overrides(m, "transform_update"):
                with unwritten(m, "transform_update", {"delta": delta}):
                    transformed(m, delta, server, 0, params)
            if acts(m, "round"):
                call(m, "server_event", ServerEvent("round", server, 0, params, {}, runner.model),
                     use=lambda r, m=m, params=params: checked_change(r, m, "round", params),
                     read_only={"global_params": params}, server=server)
    _dry_round(runner)


def _dry_step(runner: Runner, stage: StepStage, drawn: dict, batch: tuple[torch.Tensor, ...]) -> None:
    """One step of a method's step hooks (``stage``, ``drawn``: its step draw) on a fresh client: the
    loss gradient and the update taken as zeros."""
    params = runner.params
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    carry = stage.start([{}])
    key = torch.zeros((), dtype=torch.long, device=runner.device)
    with stage.watched("step_gradient", 0, params, zeros, batch, drawn, [{}], carry):
        grads = stage.rewrite(params, zeros, batch, drawn, [{}], carry, 0, key)
    with stage.watched("carry_step", 0, params, grads, batch, drawn, [{}], carry, zeros):
        stage.carried(params, grads, batch, drawn, [{}], carry, 0, zeros, key)


def _dry_round(runner: Runner) -> None:
    """Two fresh clients of the first round (their ``client_start`` ``steps`` asked for their real sample counts)
    train one local step each on two of their samples through the run's own trainer, every method at once, from
    empty client states and copies of the server states; nothing it trains is kept."""
    jobs = runner.schedule.round_jobs(0, 0)[:2]
    if len(jobs) == 1:  # one client a round: a second, fresh one beside it
        jobs.append(ClientJob(jobs[0].cid + 1, jobs[0].indices.flip(0), jobs[0].allowed, jobs[0].seed + 1))
    states = [MethodState(server=copy.deepcopy(st.server)) for st in runner.states]
    broadcasts = [{**broadcast_of(m, "round", st.server), **broadcast_of(m, "task_start", st.server)}
                  for m, st in zip(runner.methods, states, strict=True)]
    limit_epochs(jobs, runner.methods, broadcasts)
    for job in jobs:
        job.indices, job.steps_per_epoch = job.indices[:2], 1
        job.buffers = {k: v.clone() for k, v in runner.buffers.items()}
    kept = ClientStates() if runner.optimizer_states is not None else None
    round_methods = RoundMethods(runner.methods, states, broadcasts, kept, frozen=runner.client_params.frozen)
    if runner.client_params.active:
        round_methods.starts = runner.client_params.starts(jobs, runner.params, states, broadcasts, 0)
    hyper = dataclasses.replace(runner.hyper, local_epochs=1, client_block=0)
    data = runner.stream.tasks[0]
    trainer = train_sequential if trainer_kind(runner.cfg.client_execution, hyper.path) == "sequential" else \
        train_batched
    devices, mode = [runner.device] if runner.device.type == "cuda" else [], runner.model.training
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        trainer(runner.model, runner.params, jobs, data.train_x, data.train_y, 0, hyper, round_methods)
    runner.model.train(mode)
    if runner.buffers:  # the training forwards may have moved the template's statistics
        load_global_model(runner.model, {}, runner.buffers)


def _dry_start(runner: Runner, method: Method, broadcast: State) -> tuple[Params, State]:
    """A fresh client's starting parameters and state after ``method.client_start``'s params (the global model and
    ``{}`` where it has none)."""
    state: State = {}
    if not gives(method, "params"):
        return runner.params, state
    return hooks.client_start(method, "params", lambda start: check_client_start(
        runner.params if start is None else start, runner.params), server=broadcast, state=state,
        params=dict(runner.params), task=0), state


def _dry_upload(runner: Runner, method: Method, params: Params, state: State) -> None:
    """``client_upload``, its ``count_bytes`` and ``server_aggregate`` on one fresh client's starting parameters."""
    if not overrides(method, "client_upload"):
        return
    local = runner.client_params.local_names
    sent, info = call(method, "client_upload", TrainedClient(dict(params), state),
                      use=lambda upload: check_client_upload(upload, runner.params, local))
    counted(method, Payload("client_upload", sent=sent, info=info))
    stacked = StackedUploads({k: v.unsqueeze(0) for k, v in sent.items()}, {k: v.unsqueeze(0) for k, v in info.items()})
    call(method, "server_aggregate", stacked, use=lambda combined: check_server_aggregate(combined, sent,
                                                                                           runner.params))
