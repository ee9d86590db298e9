"""When CODA-P's prompt components enter the global model (``method.start`` of codap and fedcprompt;
cfl/pretrained/component_slices.py has the slices' math). ``gram-schmidt`` (CODA-P's current code, GT-RIPL/CODA-Prompt
605ac87): each task's slice enters at its task's start, drawn by Gram-Schmidt against the slices trained before it;
``orthogonal`` (Fed-CPrompt's code, grbagwe/Fed-CPrompt ``models/vit_coda_p.py``: the whole pool orthogonal at the
start, a task using rows ``[0, f)`` only): each slice enters at its task's start with its value of the run's first
orthonormal draw; both keep a later task's rows zero until then (the code's exclusion of rows from ``f`` on) and
freeze an earlier task's rows (the code's ``K[:s].detach()``: the client's step moves its task's rows only).
``at-once``: every component is in the model from the start, drawn orthonormal (codap: each trains at every task,
cfl's form before 2026-12-03; fedcprompt: each task still trains its own slice only). The server places a slice
at the synchronous task end (``server_event("task_end")``), so the two entering forms run under the synchronous
schedule only."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cfl.config.keys import Config
from cfl.config.schema import ConfigError, field
from cfl.methods.server_hooks import ServerChange
from cfl.pretrained.coda_prompt import layer_orthogonality
from cfl.pretrained.component_slices import from_layer_rows, gram_schmidt, layer_rows, task_slice
from cfl.tensors import Params, State

START_FORMS = ("gram-schmidt", "orthogonal", "at-once")
#: the component tensors, the pool their first dim
COMPONENTS = ("prompt.prompts", "prompt.keys", "prompt.attention")
#: the server-state key of the ``orthogonal`` form's first draw of the slices still to enter
WAITING = "waiting_components"


def start_field(default: str, at_once: str = "every component from the start, training at every task") -> Any:
    return field(default, "when a task's prompt components enter the global model: gram-schmidt (at its task's "
                          "start, orthogonalised against the trained ones: CODA-P's code), orthogonal (at its task's "
                          "start, from one orthonormal draw of the pool at the run's start: Fed-CPrompt's code; "
                          "both freeze the earlier tasks' and run under the synchronous schedule only) or at-once "
                          f"({at_once}; every schedule)", choices=START_FORMS)


def per_task(hparams: Any) -> bool:
    return hparams.start != "at-once"


def check_start(name: str, hparams: Any, cfg: Config) -> None:
    """The config a per-task start needs: the pool a multiple of the tasks, no weight decay and no optimiser state
    kept across rounds (either would move a frozen slice)."""
    if not per_task(hparams):
        return
    tasks, pool = cfg.stream.num_tasks, cfg.model.prompt_pool
    if tasks is not None and pool % tasks:
        raise ConfigError(f"method {name} gives each of the {tasks} tasks model.prompt_pool // {tasks} components "
                          f"(method.start: {hparams.start}); prompt_pool {pool} would leave {pool % tasks} unused: set "
                          f"it to a multiple of {tasks} (the official 100 over 10 tasks)")
    if cfg.weight_decay != 0:
        raise ConfigError(f"method {name} freezes the earlier tasks' prompt components (method.start: "
                          f"{hparams.start}), which weight decay would still shrink; set weight_decay: 0 (it is "
                          f"{cfg.weight_decay})")
    if cfg.optimizer.state == "kept" and (cfg.optimizer.name != "sgd" or cfg.momentum):
        raise ConfigError(f"method {name} freezes the earlier tasks' prompt components (method.start: "
                          f"{hparams.start}), which an optimiser state kept across rounds would still move; set "
                          "optimizer.state: fresh")


def _generator(seed: int, task: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, task, 0xC0DA]).generate_state(1)[0]))


def at_start(hparams: Any, params: Params, server: State, seed: int, num_tasks: int, layered: bool) -> Params:
    """The initial global components: task 0's slice (Gram-Schmidt, or the model's orthonormal draw), the rest
    zero; ``orthogonal`` keeps the others' draw in ``server`` until their tasks."""
    if not per_task(hparams):
        return {}
    pool = params[COMPONENTS[0]].shape[0]
    _, stop = task_slice(pool, num_tasks, 0)
    if hparams.start == "orthogonal":
        server[WAITING] = {k: params[k].clone() for k in COMPONENTS}
        return {k: torch.cat([params[k][:stop], torch.zeros_like(params[k][stop:])]) for k in COMPONENTS}
    return _drawn(params, 0, stop, _generator(seed, 0), layered)


def at_task_end(hparams: Any, params: Params, server: State, seed: int, num_tasks: int, task: int,
                layered: bool) -> ServerChange | None:
    """After task ``task``: task ``task + 1``'s slice enters (none after the last)."""
    if not per_task(hparams) or task + 1 >= num_tasks:
        return None
    start, stop = task_slice(params[COMPONENTS[0]].shape[0], num_tasks, task + 1)
    if hparams.start == "gram-schmidt":
        return ServerChange(_drawn(params, start, stop, _generator(seed, task + 1), layered))
    new = {}
    for k in COMPONENTS:
        new[k] = params[k].clone()
        new[k][start:stop] = server[WAITING][k][start:stop]
    return ServerChange(new)


def _drawn(params: Params, start: int, stop: int, generator: torch.Generator, layered: bool) -> Params:
    """Each component set's rows ``[start, stop)`` by Gram-Schmidt (prompts, keys, attention; layer by layer)."""
    return {k: from_layer_rows([gram_schmidt(r, start, stop, generator) for r in layer_rows(params[k], layered)],
                               params[k], layered) for k in COMPONENTS}


def task_rows_only(grads: Params, owner: torch.Tensor, task: torch.Tensor) -> Params:
    """The step gradient with every component row but the client's task's slice zeroed (``owner``: each row's
    task, ``task_rows``; ``task``: the batch's, not read as an item, so it runs under ``vmap``)."""
    mine = owner.to(task.device) == task[0]
    return {k: g * mine.view(-1, *([1] * (g.dim() - 1))).to(g.dtype) if k in COMPONENTS else g
            for k, g in grads.items()}


def penalty(hparams: Any, params: Params, owner: torch.Tensor | None, task: torch.Tensor, layered: bool,
            names: tuple[str, ...] = COMPONENTS) -> torch.Tensor:
    """CODA-P's orthogonality penalty summed over the component sets ``names`` (in that order) and their prefix
    layers; under a per-task start over the rows of the tasks up to the batch's (the official ``K[0:f]``)."""
    visible = owner.to(task.device) <= task[0] if per_task(hparams) and owner is not None else None
    return sum(layer_orthogonality(params[k], layered, visible) for k in names)
