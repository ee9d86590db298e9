"""One global round of the round loop (cfl/engine/rounds/runner.py ``Runner.run``): the broadcasts, the sampled
clients' local training, the server's acceptance and step, the methods' uploads and server events after it, and the
round's bytes on the ledger (cfl/engine/rounds/traffic.py). It reads and writes the run's state
(:class:`cfl.engine.rounds.run_state.RunState`) and the clients' training kit (:class:`ClientTraining`); it never sees
the runner."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cfl.engine.local import penalty_share
from cfl.engine.local.jobs import ClientJob, ClientOutcome, Hyper, RoundMethods, derive_seed, limit_epochs
from cfl.engine.rounds import server_events
from cfl.engine.rounds.client_end import client_end
from cfl.engine.rounds.hook_blame import blame_hooks
from cfl.engine.rounds.model_buffers import collect, hand_out
from cfl.engine.rounds.run_state import RunState
from cfl.engine.rounds.server import NonFiniteError
from cfl.engine.rounds.server_state import broadcast_of, payload_size
from cfl.engine.rounds.traffic import record_round, round_upload
from cfl.methods.base import acts_after_rounds
from cfl.methods.hook_types import ClientData, LocalTraining
from cfl.metrics import client_forgetting
from cfl.models.buffers import load_global_model
from cfl.records.client_states import ClientStates
from cfl.tensors import Params, State

#: a trainer: (model, params, jobs, x, y, task, hyper, round_methods) -> the stacked trained models and the outcomes
Trainer = Callable[..., tuple[Params, list[ClientOutcome]]]


@dataclass
class ClientTraining:
    """How the round's clients train: the trainer (batched, sequential or Ray), its hyperparameters, each client's
    optimiser state between its rounds (``optimizer.state: kept``, else None) and the buffers a client with its own
    BatchNorm statistics (``model.buffers: local``) starts from."""

    trainer: Trainer
    hyper: Hyper
    optimizer_states: ClientStates | None
    initial_buffers: Params


def run_round(run: RunState, local: ClientTraining, task: int, rnd: int,
              groups: list[tuple[int, list[ClientJob]]]) -> dict[str, Any]:
    """One round of ``task`` (the server's; under a schedule, the newest any client holds) with ``groups``, each
    task's sampled clients; ``rnd`` as the loop names it (:meth:`Schedule.global_round`). Returns the round's record
    (metrics.jsonl's line, less its timings)."""
    methods, states, progress = run.methods, run.states, run.progress
    jobs = [j for _, group in groups for j in group]
    task_of = {j.cid: t for t, group in groups for j in group}
    hand_out(jobs, run.buffers, run.buffer_states, local.initial_buffers)
    each_round = [broadcast_of(m, "round", st.server) for m, st in zip(methods, states, strict=True)]
    round_down = sum(payload_size(m, "round", b) for m, b in zip(methods, each_round, strict=True))
    # "task_start" keys: sent to the clients new in the task (per method), kept by them for the task's rounds
    newcomers = run.task_starts.newcomers(task, run.schedule.global_round(task, rnd), [j.cid for j in jobs])
    task_start = [run.task_starts.payload(i, st.server) for i, st in enumerate(states)]
    broadcasts = [{**r, **t} for r, t in zip(each_round, task_start, strict=True)]
    limit_epochs(jobs, methods, broadcasts)
    round_methods = RoundMethods(methods, states, broadcasts, local.optimizer_states)
    if run.client_params.active:  # each client from its own parameters (param_roles, client_start)
        round_methods.starts = {c: p for t, group in groups for c, p in
                                run.client_params.starts(group, run.params, states, broadcasts, t).items()}
    round_methods.frozen = run.client_params.frozen
    start = time.perf_counter()
    trained, outcomes = _train(run, local, groups, round_methods)
    progress.train_seconds += time.perf_counter() - start
    if run.buffers:  # the hooks' forwards in training may have moved the template's statistics: the global ones
        load_global_model(run.model, {}, run.buffers)
    try:
        keep = run.server.accept(trained, outcomes, task, rnd, broadcasts)
    except NonFiniteError as err:
        for t, group in groups:
            blame_hooks(run, local.hyper, [j for j in group if j.cid in err.clients], t, round_methods)
        raise
    penalty_share.record_round(methods, states, broadcasts, run.params, trained, outcomes, keep.tolist(), task)
    kept_jobs = [j for j, ok in zip(jobs, keep.tolist(), strict=True) if ok]
    run.client_params.keep_trained(trained, jobs, keep, states)
    combined, sent_sizes = run.client_params.uploads(trained, jobs, keep, run.params, states)
    _keep_carries(run, [o for o, ok in zip(outcomes, keep.tolist(), strict=True) if ok])
    if local.optimizer_states is not None:  # the kept clients' optimiser states, for their next round
        for o, ok in zip(outcomes, keep.tolist(), strict=True):
            if ok:
                local.optimizer_states.put(o.cid, o.optimizer_state)
    payloads = _round_uploads(run, local.hyper, trained, kept_jobs, keep, task_of, broadcasts,
                              {o.cid: o.steps for o in outcomes})
    weights = torch.tensor([float(len(j.indices)) for j in kept_jobs], device=run.device)
    forgetting = client_forgetting.measure(run.model, run.global_tensors, run.stream, task,
                                           progress.global_round + 1, run.cfg.client_forgetting_clients,
                                           kept_jobs, _with_client_buffers(run, trained, outcomes),
                                           keep)  # None when off
    run.server.step(trained, keep, weights, task, rnd, run.client_params.local_names,
                    combined)  # uses up ``trained``'s memory
    if run.buffers:
        run.server.buffers = collect([o for o, ok in zip(outcomes, keep.tolist(), strict=True) if ok], weights,
                                     run.buffer_states)
        load_global_model(run.model, {}, run.buffers)  # the hooks' functional_call(model, params) reads them
    # may set global parameters (a closed-form classifier), never write into them in place
    run.params = server_events.after_round(methods, states, payloads, run.model, run.params, task)
    backbone_down = run.shared_backbone.download_bytes([j.cid for j in jobs], progress)
    up = round_upload(methods, len(kept_jobs), run.model_bytes, run.buffers, run.params, combined,
                      sent_sizes, payloads)
    down = record_round(run.comm, methods, len(jobs), run.model_download_bytes + round_down, backbone_down,
                        task_start, newcomers, up)
    losses = [o.mean_loss for o in outcomes if o.finite]
    record = {"task": task, "round": progress.global_round + 1, "clients": len(kept_jobs),
              "train_loss": float(np.mean(losses)) if losses else float("nan"),
              "round_upload_bytes": up, "round_download_bytes": down,
              "upload_bytes": run.comm.upload_bytes, "download_bytes": run.comm.download_bytes}
    if forgetting is not None:
        progress.client_forgetting.append(forgetting)
        record["client_forgetting_mean"] = forgetting["mean"]
    return record


def _train(run: RunState, local: ClientTraining, groups: list[tuple[int, list[ClientJob]]],
           round_methods: RoundMethods) -> tuple[Params, list[ClientOutcome]]:
    """Each task's clients trained on its data; the stacked models and outcomes in the order of ``groups``."""
    parts = [local.trainer(run.model, run.params, group, run.stream.tasks[t].train_x,
                           run.stream.tasks[t].train_y, t, local.hyper, round_methods)
             for t, group in groups if group]
    if len(parts) == 1:
        return parts[0]
    return ({k: torch.cat([p[k] for p, _ in parts]) for k in parts[0][0]},
            [o for _, outcomes in parts for o in outcomes])


def _with_client_buffers(run: RunState, trained: Params, outcomes: list[ClientOutcome]) -> Params:
    """``trained`` and, for a model with running statistics, the clients' own stacked alongside (each client's
    model evaluated with its statistics: client forgetting)."""
    if not run.buffers or run.cfg.client_forgetting_clients < 2:
        return trained
    return {**trained, **{k: torch.stack([o.buffers[k] for o in outcomes]) for k in run.buffers}}


def _keep_carries(run: RunState, outcomes: list[ClientOutcome]) -> None:
    """The step hooks' running values of the kept clients into their states (``Method.client_start``'s carry)."""
    for outcome in outcomes:
        for i, carry in outcome.carry.items():
            clients = run.states[i].clients
            state = clients.get(outcome.cid)
            state.update(carry)
            clients.put(outcome.cid, state)


def _round_uploads(run: RunState, hyper: Hyper, trained: Params, jobs: list[ClientJob], keep: torch.Tensor,
                   task_of: dict[int, int], broadcasts: list[State], steps: dict[int, int]) -> list[dict[int, Any]]:
    """Each method's ``client_end("round")`` on the kept clients, at their trained models, each on its task's
    data (``task_of``: client -> task; ``steps``: each client's local steps, for ``training``): the uploads."""
    out: list[dict[int, Any]] = []
    rows = keep.nonzero().flatten().tolist()
    for i, m in enumerate(run.methods):
        uploads: dict[int, Any] = {}
        if acts_after_rounds(m):
            for job, row in zip(jobs, rows, strict=True):
                client_params = {k: v[row] for k, v in trained.items()}
                data = run.stream.tasks[task_of[job.cid]]
                cdata = ClientData(data.train_x, data.train_y, task_of[job.cid], rows=job.indices)
                gen = torch.Generator().manual_seed(derive_seed(job.seed, 0xE0D + i))
                training = LocalTraining(run.params, steps[job.cid], hyper.lr, hyper.lr_groups)
                client_end(run, i, "round", client_params, cdata, job.cid, broadcasts[i], gen, uploads, training)
        out.append(uploads)
    return out
