"""The synchronous schedule's task end (between two tasks, after the task's last round and evaluation), per
method in the run's order: ``before_task_end`` on the task's final global model, ``client_end("task_end")`` on the
participants (every joined client, or the method's own draw of ``task_end_clients``), ``server_end("task_end")``
with their uploads, then ``backbone_update`` (a change of the shared frozen backbone). The scheduled round loop
(cfl/engine/scheduled.py) runs the clients' and the server's task ends apart, and calls :func:`before_task_end`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from cfl.engine.global_model import global_model
from cfl.engine.hook_rules import BEFORE_TASK_END, check_none, check_some_params
from cfl.engine.hooks import unwritten
from cfl.engine.jobs import derive_seed
from cfl.engine.schedule import sample_clients
from cfl.engine.server_state import broadcast_of, plain_server
from cfl.engine.shared_backbone import BACKBONE_UPDATE
from cfl.engine.traffic import record_task_end
from cfl.methods.base import Method, overrides, takes_part_at_task_end
from cfl.methods.hook_guard import guarded
from cfl.methods.hook_types import ClientData
from cfl.tensors import State

#: the run's cfl.engine.runner.Runner, which calls into this module (so not imported here: no import circle)
Runner = Any


def end_task(runner: Runner, task: int) -> None:
    """Per method: the server's ``before_task_end`` on the final global model, the client task-end hooks
    (Fisher, memories, bases, GPSE) and the server's reduction."""
    start = time.perf_counter()
    parts = runner.schedule.client_indices(task)
    data = runner.stream.tasks[task]
    for i, (m, st) in enumerate(zip(runner.methods, runner.states, strict=True)):
        uploads: dict[int, Any] = {}
        if overrides(m, "before_task_end"):  # before the task-end broadcast is read
            before_task_end(runner, m, st.server, task)
        if takes_part_at_task_end(m):
            joined = runner.schedule.joined(task)  # clients_join_per_task: those that have joined
            if m.task_end_clients is None:
                cids = list(range(joined))
            else:  # a draw of its own: no real round has this index
                cids = sample_clients(runner.cfg.seed, task, 2**32 + i, joined, m.task_end_clients)
            broadcast = broadcast_of(m, "task_end", st.server)
            for c in cids:
                gen = torch.Generator().manual_seed(derive_seed(runner.cfg.seed, task, c, 0x7E + i))
                cdata = ClientData(data.train_x, data.train_y, task, rows=parts[c])
                runner._client_end(i, "task_end", runner.params, cdata, c, broadcast, gen, uploads)
            record_task_end(runner.comm, m, len(cids), runner.model_download_bytes, broadcast, uploads)
        if overrides(m, "server_end"):
            with guarded(m, "server_end"):
                m.server_end("task_end", uploads, st.server, task)
            plain_server(m, "server_end", st.server)
        if overrides(m, "backbone_update"):
            backbone_update(runner, m, st.server, task)
    runner.progress.task_end_seconds += time.perf_counter() - start


def backbone_update(runner: Runner, method: Method, server: State, task: int) -> None:
    """``method.backbone_update`` on a copy of the final global model: its deltas added into the one shared
    frozen backbone (cfl/engine/shared_backbone.py), its new parameter values set."""
    model = global_model(runner.model, runner.params, runner.buffers)
    with guarded(method, "backbone_update"), unwritten(method, "backbone_update", {"global_params": runner.params}):
        update = runner.shared_backbone.check(method.backbone_update(model, runner.params, server, task))
        new = {} if update is None else check_some_params(update.params, runner.params, BACKBONE_UPDATE)
    plain_server(method, "backbone_update", server)
    if update is not None:
        runner.shared_backbone.apply(update.deltas, method.name, task, runner.progress)
        runner.params = {**runner.params, **new}


def before_task_end(runner: Runner, method: Method, server: State, task: int,
                    classes: torch.Tensor | None = None) -> None:
    """``method.before_task_end`` on a copy of the final global model (``classes``: the finished tasks' classes,
    None: those of tasks 0..task); its wall time into ``server["stats"]``."""
    model = global_model(runner.model, runner.params, runner.buffers)
    classes = (runner.stream.seen_classes(task) if classes is None else classes).to(runner.device)
    start = time.perf_counter()
    with guarded(method, "before_task_end"):
        check_none(method.before_task_end(model, classes, server, task), BEFORE_TASK_END)
    plain_server(method, "before_task_end", server)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    stats = server.setdefault("stats", {})
    stats["before_task_end_seconds"] = stats.get("before_task_end_seconds", 0.0) + time.perf_counter() - start
