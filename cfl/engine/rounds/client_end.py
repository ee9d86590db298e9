"""A method's ``client_end`` on one client (``"round"`` after its local training, ``"task_end"`` at its switch):
the state written back and the upload kept, for the round (cfl/engine/rounds/runner.py) and the task ends
(cfl/engine/rounds/task_end.py) alike."""

from __future__ import annotations

from typing import Any

import torch

from cfl.engine.hook_call import call
from cfl.engine.hook_rules import check_upload
from cfl.engine.rounds.run_state import RunState
from cfl.methods.hook_types import ClientData, Event, LocalTraining
from cfl.methods.training_hooks import ClientEndContext
from cfl.tensors import Params, State


def client_end(run: RunState, i: int, event: Event, params: Params, data: ClientData, cid: int, server: State,
               generator: torch.Generator, uploads: dict[int, Any], training: LocalTraining | None = None) -> None:
    """Method ``i``'s ``client_end`` on client ``cid``: its state written back, its upload kept. The template
    model is in eval mode (dropout off) for both events, whichever trainer or evaluation ran last."""
    method, clients = run.methods[i], run.states[i].clients
    state = clients.get(cid)
    run.model.eval()
    ctx = ClientEndContext(event, run.model, params, data, state, server, generator, training)
    result = call(method, "client_end", ctx, use=check_upload)
    clients.put(cid, state)
    if result is not None:
        uploads[cid] = result
