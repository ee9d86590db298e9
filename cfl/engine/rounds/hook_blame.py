"""After a non-finite round (cfl/engine/rounds/server.py ``NonFiniteError``): the clients it stopped on trained again,
one after another, with every hook's result checked, so the hook that made NaN or inf from finite arguments is named."""

from __future__ import annotations

import torch

from cfl.engine.hook_call import finite_checks, takes
from cfl.engine.local.jobs import ClientJob, Hyper, RoundMethods
from cfl.engine.local.sequential import train_sequential
from cfl.engine.rounds.run_state import RunState
from cfl.methods.hook_guard import VMAPPED_HOOKS
from cfl.models.buffers import load_global_model


def blame_hooks(run: RunState, hyper: Hyper, jobs: list[ClientJob], task: int, round_methods: RoundMethods) -> None:
    """Train ``jobs`` of ``task`` again under :class:`cfl.engine.hook_call.finite_checks`: a hook that made NaN or
    inf from finite arguments is named (``HookError``, exit code 3) in place of the advice to lower lr. Nothing on
    the way: only methods that make values in local training, only after such a stop; the RNG is forked, so the
    retraining draws nothing from the run's."""
    if not jobs or not any(takes(m, h) for m in run.methods for h in VMAPPED_HOOKS):
        return
    data = run.stream.tasks[task]
    devices = [run.device] if run.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), finite_checks():
        train_sequential(run.model, run.params, jobs, data.train_x, data.train_y, task, hyper, round_methods)
    if run.buffers:
        load_global_model(run.model, {}, run.buffers)
