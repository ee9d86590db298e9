"""The checks of what a method class declares (``broadcast``, ``scenarios``, ``running_stats_model``): when the
class is made (:meth:`cfl.methods.base.Method.__init_subclass__`), when the method is built, and when the config is
validated (``cfl/cross_checks.py``). Each refuses with the declaration at fault and the fix. ``cls`` is a method
class (a :class:`cfl.methods.base.Method`, which imports this module)."""

from __future__ import annotations

from torch import nn

from cfl.models.buffers import keeps_running_stats
from cfl.schema import ConfigError

#: when a method's ``broadcast`` keys are sent: with every round's model, to a client at its first sampled round
#: of each task (kept by the client for the task's later rounds), to the task-end participants
BROADCAST_EVENTS = ("round", "task_start", "task_end")


def refuse_model_without_running_stats(cls: type, model: nn.Module) -> None:
    """Raise ``ConfigError`` when ``cls`` reads BatchNorm running statistics (``running_stats_model``) and ``model``
    keeps none (the config's check names the model; this one also covers a method built directly)."""
    if cls.running_stats_model and not keeps_running_stats(model):
        raise ConfigError(f"method {cls.name} matches its synthetic images to the model's BatchNorm running "
                          f"statistics; {type(model).__name__} keeps none: set model.name: {cls.running_stats_model}")


def refuse_scenario(cls: type, scenario: str) -> None:
    """Raise ``ConfigError`` when ``cls`` declares its ``scenarios`` and ``scenario`` (resolved; ``auto``: not known
    yet, let through) is not among them."""
    if not cls.scenarios or scenario == "auto" or scenario in cls.scenarios:
        return
    kinds = " or ".join(f"{s}-incremental" for s in cls.scenarios)
    why = f" ({cls.scenarios_why})" if cls.scenarios_why else ""
    raise ConfigError(f"method {cls.name} is {kinds} only{why}; the run's scenario is {scenario}: set "
                      f"stream.scenario: {cls.scenarios[0]}")


def check_broadcast(cls: type) -> None:
    """Refuse a ``broadcast`` declaration with an unknown event or a key sent both each round and at task starts."""
    unknown = [e for e in cls.broadcast if e not in BROADCAST_EVENTS]
    if unknown:
        raise TypeError(f"{cls.__name__}.broadcast names the event(s) {unknown}; the events are "
                        f"{list(BROADCAST_EVENTS)}")
    both = sorted(set(cls.broadcast.get("round", ())) & set(cls.broadcast.get("task_start", ())))
    if both:
        raise TypeError(f"{cls.__name__}.broadcast lists {both} under both 'round' and 'task_start': a key goes "
                        f"either with every round or once per client and task; keep it under one")
