"""The checks of a run's schedule (cfl/schedules.py), made when the config is validated, before any data: the plan
(every task held, every round with a client, leavers leaving before the end; notes for thin or very long plans), the
``schedule`` keys its builder reads, and the schedules each method declares it runs under
(``Method.requires.schedules``)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import numpy as np

from cfl.config.keys import Config
from cfl.config.schema import ConfigError
from cfl.ignored_keys import IgnoredKey
from cfl.methods.base import Method
from cfl.schedules import SCHEDULES, Plan

#: a plan longer than this many global rounds is said (``schedule.every`` or ``schedule.offset`` set too high)
LONG_RUN_ROUNDS = 10_000


def check_plan(plan: Plan, clients_per_round: int) -> list[str]:
    """Refuse a plan that leaves a task with no client or a round with none, or whose clients leave at or after
    its last round (``ConfigError`` with the fix); the notes to print (rounds with fewer clients than
    ``clients_per_round``, a run of more than :data:`LONG_RUN_ROUNDS` rounds)."""
    late = sorted({line.leaves for line in plan.timelines if line.leaves is not None and line.leaves >= plan.rounds})
    if late:
        raise ConfigError(f"'schedule.leave_round: {late[0]}' is at or after the run's end ({plan.rounds} global "
                          "rounds): the leaving clients would never leave; lower schedule.leave_round below "
                          f"{plan.rounds}, or remove schedule.leave_clients")
    held = {task for _, task, _, _ in plan.intervals()}
    empty = [t for t in range(plan.num_tasks) if t not in held]
    if empty:
        raise ConfigError(f"schedule '{plan.name}' gives task(s) {empty} (0-based) to no client: every task's data "
                          "must be trained on; raise schedule.tasks_per_client or num_clients, lower "
                          "schedule.overlap, or raise schedule.leave_round")
    present = plan.clients_per_round()
    idle = np.flatnonzero(present == 0)
    if len(idle):
        raise ConfigError(f"schedule '{plan.name}' has no client in global round(s) {idle[:5].tolist()} (0-based) "
                          f"of {plan.rounds}: lower schedule.join_round or raise schedule.leave_round")
    notes = []
    if plan.rounds > LONG_RUN_ROUNDS and not plan.synchronous:
        notes.append(f"schedule '{plan.name}' makes a run of {plan.rounds:,} global rounds (more than "
                     f"{LONG_RUN_ROUNDS:,}: schedule.every, schedule.offset or schedule.spread set high); lower "
                     "them if that was not meant")
    few = np.flatnonzero(present < clients_per_round)
    if len(few):
        return notes + [f"schedule '{plan.name}': {len(few)} of {plan.rounds} rounds have fewer clients than "
                f"clients_per_round={clients_per_round} (as few as {int(present.min())}); those rounds sample all "
                "of theirs"]
    return notes


def check_schedule_keys(cfg: Config) -> None:
    """Refuse a ``schedule`` key its builder does not read (:class:`cfl.ignored_keys.IgnoredKey`), the old
    ``clients_join_per_task`` beside another schedule or beside ``schedule.join_per_task``."""
    section = cfg.schedule
    if section.name not in SCHEDULES:
        raise SCHEDULES.unknown(section.name, "schedule.name")

    def reads(name: str) -> set[str]:
        params = set(inspect.signature(SCHEDULES[name]).parameters) - {"inp"}
        drawn = params & {"order", "spread"}  # a builder with a draw reads the seed
        metrics = {"forgetting"} if name != "synchronous" else set()  # where FGT counts from; sync: one moment
        return params | ({"seed"} if drawn else set()) | metrics

    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name == "name" or value == f.default or f.name in reads(section.name):
            continue
        readers = [n for n in SCHEDULES if f.name in reads(n)]
        raise IgnoredKey(f"schedule.{f.name}", value, "schedule.name", section.name,
                         f"only {', '.join(readers)} read it" if readers else "nothing reads it",
                         f"remove schedule.{f.name}" + (f", or set schedule.name: {readers[0]}" if readers else ""),
                         readers[0] if readers else None)
    if cfg.clients_join_per_task and section.name != "synchronous":
        raise ConfigError(f"'clients_join_per_task: {cfg.clients_join_per_task}' is GLFC's joining protocol, the "
                          f"synchronous schedule's join_per_task, but 'schedule.name: {section.name}'; remove it, or "
                          "use schedule.late_clients and schedule.join_round")
    if cfg.clients_join_per_task and section.join_per_task:
        raise ConfigError("'clients_join_per_task' and 'schedule.join_per_task' are the same key given twice; keep "
                          "schedule.join_per_task")


def schedules_allowed(cls: type[Method], spec: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The schedules method ``cls`` runs under with its spec ``spec`` (its hyperparameters; None: unknown, so
    ``schedules_unless`` is not granted); empty: every schedule."""
    req = cls.requires
    if req.schedules and req.schedules_unless and spec is not None:
        key, value = req.schedules_unless
        if spec.get(key, cls.Hyperparams.__dataclass_fields__[key].default) == value:
            return ()
    return tuple(req.schedules)


def check_methods_schedule(name: str, methods: list[type[Method]], specs: list[dict[str, Any]] | None = None) -> None:
    """Refuse a method that declares the schedules it runs under (``Method.requires.schedules``) and not ``name``,
    unless its spec (``specs``, in the order of ``methods``) sets the hyperparameter of ``schedules_unless``."""
    for i, cls in enumerate(methods):
        req = cls.requires
        allowed = schedules_allowed(cls, None if specs is None else specs[i])
        if not allowed or name in allowed:
            continue
        unless = f", or set method.{req.schedules_unless[0]}: {req.schedules_unless[1]}" if req.schedules_unless \
            else ""
        why = f": {req.schedules_why}" if req.schedules_why else ""
        raise ConfigError(f"method {cls.name} runs under schedule {' or '.join(req.schedules)} only{why}; the "
                          f"run's schedule is {name}: set schedule.name: {req.schedules[0]}{unless}")
