"""The ``results.json`` document of a run, computed from a snapshot of the run (:mod:`cfl.records.snapshot`)."""

from __future__ import annotations

from typing import Any

from cfl.config.keys import Config
from cfl.methods.base import Method, takes_part_at_task_end
from cfl.methods.display import method_info
from cfl.metrics import client_forgetting
from cfl.metrics.matrix import (
    average_accuracy,
    average_incremental_accuracy,
    backward_transfer,
    forgetting,
    forward_transfer,
    rounds_to_targets,
)
from cfl.records.client_states import MethodState
from cfl.records.comm import CommLedger, task_end_model_line, task_start_line
from cfl.records.snapshot import RunSnapshot


def targets_per_task(evaluations: list[dict[str, Any]], targets: list[float],
                     rounds_per_task: int) -> dict[str, dict[str, Any]]:
    """Per task: rounds (counted from the task's start) until its own test accuracy reached each target."""
    out: dict[str, dict[str, Any]] = {}
    for t in sorted({e["task"] for e in evaluations}):
        curve = [(e["round"] - t * rounds_per_task, e["acc"][str(t)]) for e in evaluations if e["task"] == t]
        out[str(t)] = rounds_to_targets(curve, targets)
    return out


def client_state_bytes(state: MethodState) -> dict[str, Any]:
    """Bytes each client keeps: mean and max over the clients that hold any state, and their count."""
    clients = state.clients
    sizes = [clients.nbytes(c) for c in clients.ids()]  # from the index on disk: no state is read
    if not sizes:
        return {"client_state_bytes_mean": 0.0, "client_state_bytes_max": 0, "clients_with_state": 0}
    return {"client_state_bytes_mean": sum(sizes) / len(sizes), "client_state_bytes_max": max(sizes),
            "clients_with_state": len(sizes)}


def method_stats(comm: CommLedger, method: Method, state: MethodState) -> dict[str, Any]:
    """A method's figures: its clients' state sizes, what it put in its server state's ``stats``, and the bytes
    of the final global models its task-end participants downloaded (a line of ``download_bytes`` of its
    own, so communication tables can compare with or without), and those of its ``"task_start"`` broadcast."""
    stats = {**client_state_bytes(state), **state.server.get("stats", {})}
    if takes_part_at_task_end(method):
        stats["task_end_model_download_bytes"] = comm.lines.get(task_end_model_line(method.name), 0)
    if method.sends.broadcast.get("task_start"):
        stats["task_start_download_bytes"] = comm.lines.get(task_start_line(method.name), 0)
    return stats


def scheduled_results(cfg: Config, num_tasks: int, evaluations: list[dict[str, Any]], complete: bool,
                      before: dict[str, float] | None = None, init: list[float] | None = None) -> dict[str, Any]:
    """ACC, FGT, BWT, AIA and FWT under a schedule (from the evaluations, global and per client; FGT and AIA
    from the evaluations ``schedule.forgetting`` names; FWT from ``before``, ``acc_before_task``, and ``init``,
    ``acc_init``) in place of the matrix's. An unfinished run has none."""
    from cfl.metrics.asynchronous import scheduled_metrics
    from cfl.schedules import build_plan

    plan = build_plan(cfg, num_tasks)
    if not complete or not evaluations:
        return {"acc": None, "fgt": None, "bwt": None, "aia": None, "fwt": None, "schedule": {"name": plan.name}}
    metrics = scheduled_metrics(evaluations, plan, cfg.schedule.forgetting, before, init)
    return {"acc": metrics["acc"], "fgt": metrics["fgt"], "bwt": metrics["bwt"], "aia": metrics["aia"],
            "fwt": metrics["fwt"], "schedule": metrics}


def build_results(run: RunSnapshot, wall_seconds: float) -> dict[str, Any]:
    cfg, stream, prog = run.cfg, run.stream, run.progress
    done = prog.task  # tasks completed
    matrix = prog.acc_matrix
    # under a schedule the matrix's rows are evaluations at each task's learned moment, which may precede another
    # task's start (a None cell): its metrics are scheduled_results' own (below), not the matrix's
    measured = done if cfg.schedule.name == "synchronous" else 0
    before = [prog.acc_before_task.get(str(i)) for i in range(stream.num_tasks)]
    results: dict[str, Any] = {
        "stream": stream.name,
        "scenario": stream.scenario,
        "method": cfg.method_label,
        "partition": cfg.partition.name,
        "seed": cfg.seed,
        "num_tasks": stream.num_tasks,
        "tasks_completed": done,
        "complete": done == stream.num_tasks,
        "acc_matrix": matrix,
        "acc": average_accuracy(matrix, done - 1) if measured else None,
        "fgt": forgetting(matrix, done - 1) if measured else None,
        "bwt": backward_transfer(matrix, done - 1) if measured else None,
        "aia": average_incremental_accuracy(matrix, done - 1) if measured else None,
        "fwt": forward_transfer(before, prog.acc_init, done - 1) if measured else None,
        "acc_init": prog.acc_init or None,
        "acc_before_task": before if prog.acc_before_task else None,
        "rounds": prog.global_round,
        "resumed_after_rounds": list(prog.resumed_after_rounds),  # the run's history, not its results
        "wall_seconds": wall_seconds,
        "train_seconds": prog.train_seconds,
        "task_end_seconds": prog.task_end_seconds,
        "upload_bytes": run.comm.upload_bytes,
        "download_bytes": run.comm.download_bytes,
        "model_bytes": run.model_bytes,
        "engine_path": run.engine_path,
        "method_stats": {m.name: method_stats(run.comm, m, st) for m, st in zip(run.methods, run.states, strict=True)},
        "config": cfg.to_dict(),
        # what a report needs to label the run without the plugin files that registered its methods
        "method_info": method_info([m.name for m in run.methods]),
    }
    if not cfg.schedule.name == "synchronous":  # clients on their own tasks: cfl/metrics/asynchronous.py
        results.update(scheduled_results(cfg, stream.num_tasks, prog.evaluations, done == stream.num_tasks,
                                         prog.acc_before_task, prog.acc_init))
    if stream.scenario == "class":
        results["class_acc"] = prog.class_acc
    if prog.backbone_changes:  # a method changed the shared frozen backbone (ServerChange.backbone)
        results["backbone_changes"] = prog.backbone_changes
        results["backbone_download_bytes"] = run.comm.lines.get("shared_backbone", 0)
    if cfg.target_accuracies:
        results["rounds_to_target"] = targets_per_task(prog.evaluations, cfg.target_accuracies, cfg.rounds_per_task)
    if cfg.client_forgetting_clients:
        results["client_forgetting"] = {"clients_per_round": cfg.client_forgetting_clients,
                                        **client_forgetting.summarise(prog.client_forgetting)}
    return results
