"""The task ends after a round at which some clients switch task (cfl/schedules.py ``Plan.switches``), under
every plan:

* a client's task end is its own event: each method's ``client_end("task_end")`` on its rows of the task it
  leaves, with the then-current global model (and the method's ``"task_end"`` broadcast); a method that draws
  its own task-end clients (``task_end_clients``) draws them among the task's finishers (:func:`task_end_draws`).
  The uploads go to ``server_event("task_end")`` at once (``Method.sends.server_task_end: switch``), or
  are held in the method's server state (:data:`HELD`) until the server's task end (``last_holder``);
* the server's task end of a task comes when its last holder has switched away from it:
  ``server_event("before_task_end")`` on the global model of that moment (its classes those of every task all of
  whose holders have left it), then a ``last_holder`` method's ``server_event("task_end")``.

Under the synchronous plan every client leaves a task at once, and each method's whole task end runs in turn,
``server_event("before_task_end")`` first (its clients' hooks read what it made): ``server_event("before_task_end")``,
the clients', ``server_event("task_end")`` (which may change the shared frozen backbone: synchronous only); under
any other plan every method's client task ends come first, then each left task's server task end.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from cfl.engine.hook_call import call
from cfl.engine.hook_rules import BEFORE_TASK_END, check_none, check_some_params
from cfl.engine.local.jobs import derive_seed
from cfl.engine.rounds.client_end import client_end
from cfl.engine.rounds.global_model import global_model
from cfl.engine.rounds.round_draws import sample_clients
from cfl.engine.rounds.run_state import RunState
from cfl.engine.rounds.server_events import acts, checked_change
from cfl.engine.rounds.server_state import broadcast_of
from cfl.engine.rounds.shared_backbone import BACKBONE_UPDATE
from cfl.engine.rounds.traffic import record_task_end
from cfl.methods.base import Method, takes_part_at_task_end
from cfl.methods.hook_types import ClientData
from cfl.methods.server_hooks import ServerChange, ServerEvent
from cfl.records.client_states import MethodState
from cfl.schedules import Plan
from cfl.tensors import State

#: the server-state key under which the engine holds a ``server_task_end: last_holder`` method's task-end uploads
#: (task -> client -> upload) from the clients' own task ends until the task's server-side end (checkpointed)
HELD = "held_task_end_uploads"


def task_end_draws(plan: Plan, methods: list[Method], seed: int) -> dict[tuple[int, int], set[int]]:
    """(method index, task) -> the clients a method that draws its own task-end clients (``task_end_clients``)
    takes among those that finish the task (known from the plan: a pure function of the seed); fewer finishers
    than its draw: all of them, said on stderr."""
    out = {}
    for i, m in enumerate(methods):
        if m.task_end_clients is None or not takes_part_at_task_end(m):
            continue
        for task in range(plan.num_tasks):
            finishers = plan.finishers(task)
            if not finishers:
                continue
            k = min(m.task_end_clients, len(finishers))
            if k < m.task_end_clients:
                print(f"cfl: method {m.name} draws {m.task_end_clients} task-end clients, but under schedule "
                      f"'{plan.name}' only {len(finishers)} finish task {task}: all of them take part",
                      file=sys.stderr)
            picks = sample_clients(seed, task, 2**32 + i, len(finishers), k)  # no real round has this index
            out[(i, task)] = {finishers[j] for j in picks}
    return out


def end_tasks(run: RunState, rnd: int, switched: list[tuple[int, int]], leaving: list[int]) -> None:
    """The task ends after global round ``rnd``: ``switched``, the (client, task) pairs switching; ``leaving``,
    the tasks whose last holder has just left (module docstring for the order)."""
    start = time.perf_counter()
    run.task_starts.before_task_ends([st.server for st in run.states])
    left = [t for t, r in run.plan.last_left().items() if r <= rnd]
    classes = torch.tensor(sorted({c for t in left for c in run.stream.tasks[t].classes}), dtype=torch.long)
    pairs = list(enumerate(zip(run.methods, run.states, strict=True)))
    if run.plan.synchronous:  # each method's whole task end in turn
        for i, (m, st) in pairs:
            server_task_end(run, m, st, leaving, classes, before=True)
            client_task_ends(run, i, switched)
            server_task_end(run, m, st, leaving, classes, before=False)
    else:
        for i, _ in pairs:
            client_task_ends(run, i, switched)
        for task in leaving:
            for _, (m, st) in pairs:
                server_task_end(run, m, st, [task], classes, before=True)
                server_task_end(run, m, st, [task], classes, before=False)
    run.task_starts.after_task_ends(rnd, [st.server for st in run.states])
    run.progress.task_end_seconds += time.perf_counter() - start


def client_task_ends(run: RunState, i: int, switched: list[tuple[int, int]]) -> None:
    """Method ``i``'s ``client_end("task_end")`` on the clients switching (each on its rows of the task it leaves,
    at the current global model; a method's own draw: its drawn clients only), then, per task left, its
    ``server_event("task_end")`` with their uploads, or (``last_holder``) the uploads held in its server state."""
    m, st = run.methods[i], run.states[i]
    for task in sorted({t for _, t in switched}):
        uploads: dict[int, Any] = {}
        drawn = run.task_end_draws.get((i, task))
        cids = [c for c, t in switched if t == task and (drawn is None or c in drawn)]
        if takes_part_at_task_end(m) and cids:
            broadcast = broadcast_of(m, "task_end", st.server)
            data, rows = run.stream.tasks[task], run.schedule.client_indices(task)
            for c in cids:
                gen = torch.Generator().manual_seed(derive_seed(run.cfg.seed, task, c, 0x7E + i))
                cdata = ClientData(data.train_x, data.train_y, task, rows=rows[c])
                client_end(run, i, "task_end", run.params, cdata, c, broadcast, gen, uploads)
            record_task_end(run.comm, m, len(cids), run.model_download_bytes, broadcast, uploads)
        if m.sends.server_task_end == "last_holder":
            if uploads:  # a task some client holds to the run's end never uses them
                st.server.setdefault(HELD, {}).setdefault(task, {}).update(uploads)
        elif acts(m, "task_end"):
            task_end(run, m, st.server, uploads, task)


def server_task_end(run: RunState, m: Method, st: MethodState, tasks: list[int], classes: torch.Tensor,
                    before: bool) -> None:
    """The server's task end of ``tasks`` for ``m``: ``before``, its ``server_event("before_task_end")``; else a
    ``last_holder`` method's ``server_event("task_end")`` with the uploads held for the task."""
    for task in tasks:
        if before:
            if acts(m, "before_task_end"):
                before_task_end(run, m, st.server, task, classes)
            continue
        if m.sends.server_task_end == "last_holder":
            held = st.server.get(HELD, {})
            uploads = held.pop(task, {})
            if not held:
                st.server.pop(HELD, None)
            if acts(m, "task_end"):
                task_end(run, m, st.server, uploads, task)


def task_end(run: RunState, method: Method, server: State, uploads: dict[int, Any], task: int) -> None:
    """``method.server_event("task_end")`` (a method declaring ``changes_backbone``: on a copy of the final global
    model): its backbone deltas added into the one shared frozen backbone (cfl/engine/rounds/shared_backbone.py), its
    new parameter values set."""
    model = global_model(run.model, run.params, run.buffers) if method.sends.changes_backbone else None
    ctx = ServerEvent("task_end", server, task, run.params, uploads, model)
    change = call(method, "server_event", ctx, use=lambda r: _checked_task_end(run, method, r),
                  read_only={"global_params": run.params}, server=server)
    if change.backbone is not None:
        run.shared_backbone.apply(change.backbone.deltas, method.name, task, run.progress)
    run.params = {**run.params, **change.params}


def _checked_task_end(run: RunState, method: Method, result: Any) -> ServerChange:
    change = checked_change(result, method, "task_end", run.params)
    update = run.shared_backbone.check(change.backbone)
    new = {} if update is None else check_some_params(update.params, run.params, BACKBONE_UPDATE)
    return ServerChange({**change.params, **new}, update)


def before_task_end(run: RunState, method: Method, server: State, task: int, classes: torch.Tensor) -> None:
    """``method.server_event("before_task_end")`` on a copy of the current global model (``classes``: the finished
    tasks'); its wall time into ``server["stats"]``."""
    model = global_model(run.model, run.params, run.buffers)
    classes = classes.to(run.device)
    start = time.perf_counter()
    ctx = ServerEvent("before_task_end", server, task, run.params, model=model, classes=classes)
    call(method, "server_event", ctx, use=lambda r: check_none(r, BEFORE_TASK_END),
         read_only={"global_params": run.params}, server=server)
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    stats = server.setdefault("stats", {})
    stats["before_task_end_seconds"] = stats.get("before_task_end_seconds", 0.0) + time.perf_counter() - start
