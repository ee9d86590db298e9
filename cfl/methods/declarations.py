"""What a method class declares beside its ``name``, ``about`` and ``Hyperparams`` (docs/plugins.md,
"Declarations"): three frozen dataclasses, each a class attribute of the method, each checked when it is made:

- ``requires = Requires(...)``: what the method requires of the run (its models, the model's training mode,
  scenarios, schedules, the config keys it leaves unread), refused when the config is validated;
- ``sends = Sends(...)``: what it sends and when (broadcast keys, the task-end model download, the events whose
  ``client_end`` and the moments whose ``server_event`` it acts on, when its server reduces task-end uploads, whether
  it changes the shared backbone);
- ``computes = Computes(...)``: what its client side computes, the parts it gives of the hooks asked by part
  (``loss``, ``samples``, ``round_terms``, ``client_start``), and how its clients' states batch (ragged tensors, a
  reason to train sequentially).

Their kinds are the ``Literal`` types below, shared by the engine and the docs. The checks of a built method and
of a config against these declarations are here too (``refuse_scenario``, ``refuse_model_without_running_stats``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

from torch import nn

from cfl.config.schema import ConfigError
from cfl.methods.hook_types import EVENTS, Event
from cfl.methods.server_hooks import SERVER_EVENTS, ServerMoment
from cfl.models.buffers import keeps_running_stats

#: when a method's ``broadcast`` keys are sent: with every round's model, to a client at its first sampled round
#: of each task (kept by the client for the task's later rounds), to the task-end participants
BroadcastEvent = Literal["round", "task_start", "task_end"]
#: the scenarios a method may require (``stream.scenario``)
Scenario = Literal["domain", "task", "class"]
#: the ``model.train`` a backbone method needs ("": any model, trained from scratch or not)
ModelTrain = Literal["", "head", "prompts", "components", "task-components", "dual-prompts", "lora", "all"]
#: under a schedule other than the synchronous one, when ``server_event("task_end")`` runs
ServerTaskEnd = Literal["switch", "last_holder"]

BROADCAST_EVENTS: tuple[BroadcastEvent, ...] = get_args(BroadcastEvent)
SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)
MODEL_TRAINS: tuple[ModelTrain, ...] = get_args(ModelTrain)
SERVER_TASK_ENDS: tuple[ServerTaskEnd, ...] = get_args(ServerTaskEnd)

#: the parts of the hooks the engine asks by part, each at its own moment (``ctx.part``): ``loss`` "task" (in place
#: of the cross-entropy) and "extra" (added); ``samples`` "replay" (trained on) and "step" (for the step hooks);
#: ``round_terms`` "penalty", "preconditioner", "projection"; ``client_start`` "steps", "params", "carry"
LossPart = Literal["task", "extra"]
DrawPart = Literal["replay", "step"]
TermPart = Literal["penalty", "preconditioner", "projection"]
StartPart = Literal["steps", "params", "carry"]
#: hook -> (the Computes field listing its parts, the parts)
HOOK_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "loss": ("losses", get_args(LossPart)), "samples": ("draws", get_args(DrawPart)),
    "round_terms": ("terms", get_args(TermPart)), "client_start": ("starts", get_args(StartPart)),
}


class _Frozen:
    """Shared by the three: a mapping field is kept read-only (a ``MappingProxyType``), a sequence one as a tuple;
    pickled and copied through plain dicts (a mapping proxy cannot be pickled)."""

    def _freeze(self, name: str, value: Any) -> None:
        if isinstance(value, Mapping):
            value = MappingProxyType({k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in value.items()})
        elif isinstance(value, list):
            value = tuple(value)
        object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        values = (getattr(self, f.name) for f in dataclasses.fields(self))  # type: ignore[arg-type]
        return type(self), tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values)


def _refuse_unknown(owner: str, given: Any, allowed: tuple[str, ...], what: str) -> None:
    unknown = [g for g in given if g not in allowed]
    if unknown:
        raise TypeError(f"{owner} names the {what} {unknown}; they are {list(allowed)}")


@dataclass(frozen=True)
class Requires(_Frozen):
    """What a method requires of the run; each is refused otherwise when the config is validated."""

    #: the models only this method can train (a model family of its own, e.g. FedWeIT's decomposed networks): the
    #: run's model must be one of them, and no other method may train them
    models: tuple[str, ...] = ()
    #: a model with BatchNorm running statistics, for a method that reads them (TARGET's and MFCL's synthesis match
    #: them): the run's model must keep running statistics (also when the method is built); ``model.name: auto`` is it
    running_stats_model: str = ""
    #: the ``model.train`` a backbone method needs (``head``: cached features; ``prompts``, ``components``,
    #: ``lora``: its adapter; "": any model); a non-empty one also requires a frozen pretrained backbone
    #: (docs/pretrained.md): :attr:`backbone_only`
    model_train: ModelTrain = ""
    #: the scenarios the method runs in (empty: every one), and why (a clause for the refusal): a run in another is
    #: refused when the config is validated (``auto``: the stream's default) and when the method is built
    scenarios: tuple[Scenario, ...] = ()
    scenarios_why: str = ""
    #: the schedules (``schedule.name``, cfl/schedules.py) the method runs under (empty: every one), and why
    schedules: tuple[str, ...] = ()
    schedules_why: str = ""
    #: a hyperparameter setting ``(name, value)`` under which ``schedules`` does not hold (e.g. codap's
    #: ``("start", "at-once")``: no component enters at a task end); empty: ``schedules`` always holds
    schedules_unless: tuple[str, ...] = ()
    #: top-level config keys the method makes unread -> why (a run setting one away from its default is refused,
    #: cfl/ignored_keys.py), e.g. an adaptive server's ``{"server_lr": "..."}``
    unread_keys: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("models", "scenarios", "schedules", "unread_keys"):
            self._freeze(name, getattr(self, name))
        _refuse_unknown("Requires.scenarios", self.scenarios, SCENARIOS, "scenario(s)")
        _refuse_unknown("Requires.model_train", (self.model_train,), MODEL_TRAINS, "training mode")

    @property
    def backbone_only(self) -> bool:
        """The method trains on a frozen pretrained backbone (every ``model_train`` but "" is a backbone's): the
        run's model must be a backbone (refused when the config is validated)."""
        return bool(self.model_train)


@dataclass(frozen=True)
class Sends(_Frozen):
    """What a method sends and when, and the events it acts on (counted in the run's traffic)."""

    #: server-state keys sent to the clients, per event ("round": with the model each round; "task_start": to a
    #: client at its first sampled round of each task, once, and the client's hooks see them in all of the task's
    #: rounds; "task_end": to the task-end participants); counted as download bytes
    broadcast: Mapping[BroadcastEvent, tuple[str, ...]] = field(default_factory=dict)
    #: whether the task-end participants download the task's final global model (counted in ``download_bytes``
    #: and on the line ``method_stats.<name>.task_end_model_download_bytes``)
    downloads_model_at_task_end: bool = True
    #: the events whose ``client_end`` the method acts on; the engine calls it for those only (a method that acts
    #: at task ends only costs its rounds nothing: no state read, no call per client)
    client_events: tuple[Event, ...] = ("round", "task_end")
    #: the server moments whose ``server_event`` the method acts on (cfl/methods/server_hooks.py); the engine calls
    #: it at those only (no model copy, no call at the others)
    server_events: tuple[ServerMoment, ...] = SERVER_EVENTS
    #: the method's ``server_event("task_end")`` may change the shared frozen backbone (``ServerChange.backbone``):
    #: synchronous schedule only (``requires = Requires(schedules=("synchronous",))``), a pretrained backbone run
    #: through its adapter (refused when the config is validated)
    changes_backbone: bool = False
    #: under a schedule other than the synchronous one, when ``server_event("task_end")`` runs:
    #: "switch" after each round at which clients leave ``task``, with their uploads; "last_holder": once, when the
    #: task's last holder has left it (after ``server_event("before_task_end")``), with every upload held since the
    #: clients' own task ends (cfl/engine/rounds/task_end.py)
    server_task_end: ServerTaskEnd = "switch"

    def __post_init__(self) -> None:
        self._freeze("broadcast", self.broadcast)
        self._freeze("client_events", self.client_events)
        self._freeze("server_events", self.server_events)
        _refuse_unknown("Sends.server_events", self.server_events, SERVER_EVENTS, "moment(s)")
        _refuse_unknown("Sends.broadcast", self.broadcast, BROADCAST_EVENTS, "event(s)")
        _refuse_unknown("Sends.client_events", self.client_events, EVENTS, "event(s)")
        _refuse_unknown("Sends.server_task_end", (self.server_task_end,), SERVER_TASK_ENDS, "value")
        both = sorted(set(self.broadcast.get("round", ())) & set(self.broadcast.get("task_start", ())))
        if both:
            raise TypeError(f"Sends.broadcast lists {both} under both 'round' and 'task_start': a key goes either "
                            "with every round or once per client and task; keep it under one")


@dataclass(frozen=True)
class Computes(_Frozen):
    """What a method's client side computes: the parts it gives of the hooks the engine asks by part (each asked at
    its moment, only of the methods that declare it: what decides the engine's path), and how its client states
    batch in the engine's stacked paths (docs/plugins.md, "The engine's path")."""

    #: the parts of ``loss`` it gives: "task" (in place of the cross-entropy; one method of a run at most), "extra"
    losses: tuple[LossPart, ...] = ()
    #: the parts of ``samples`` it gives: "replay" (appended to the step's batch), "step" (for the step hooks)
    draws: tuple[DrawPart, ...] = ()
    #: the parts of ``round_terms`` it gives: "penalty", "preconditioner", "projection"
    terms: tuple[TermPart, ...] = ()
    #: the parts of ``client_start`` it gives: "steps" (local steps per epoch), "params" (starting parameters),
    #: "carry" (the step hooks' running values)
    starts: tuple[StartPart, ...] = ()

    #: client-state tensors whose size differs between clients: key (a nested key's dotted path, or the path of a
    #: dict holding them) -> dim; the engine zero-pads that dim to the widest client
    ragged: Mapping[str, int] = field(default_factory=dict)
    #: why the method's hooks cannot run under ``torch.func.vmap`` (e.g. a step hook that calls a solver outside
    #: torch), or "": a non-empty reason sends the run to the sequential path, said on stderr
    sequential_reason: str = ""

    def __post_init__(self) -> None:
        self._freeze("ragged", self.ragged)
        for field_name, parts in HOOK_PARTS.values():
            self._freeze(field_name, getattr(self, field_name))
            given = getattr(self, field_name)
            _refuse_unknown(f"Computes.{field_name}", given, parts, "part(s)")
            if len(set(given)) != len(given):
                raise TypeError(f"Computes.{field_name} lists a part twice: {list(given)}")
        bad = [k for k, dim in self.ragged.items() if not isinstance(dim, int) or isinstance(dim, bool)]
        if bad:
            raise TypeError(f"Computes.ragged maps {bad} to no dimension; each key maps to the int dim that differs")


def gives(method: Any, part: str) -> bool:
    """Whether ``method`` (a method or its class) declares ``part`` of a hook asked by part (:data:`HOOK_PARTS`)."""
    computes = method.computes
    return any(part in getattr(computes, field_name) for field_name, _ in HOOK_PARTS.values())


def check_parts(cls: Any, base: Any, hooks: tuple[str, ...] = tuple(HOOK_PARTS)) -> None:
    """At class creation: a class that declares parts of a hook (of ``hooks``) overrides it, and one that overrides
    such a hook declares the parts it gives."""
    for hook in hooks:
        field_name = HOOK_PARTS[hook][0]
        declared, overridden = getattr(cls.computes, field_name), getattr(cls, hook) is not getattr(base, hook)
        if declared and not overridden:
            raise TypeError(f"{cls.__name__} declares computes=Computes({field_name}={list(declared)}) but does not "
                            f"override {hook}")
        if overridden and not declared:
            raise TypeError(f"{cls.__name__} overrides {hook}, which the engine asks by part: declare the parts it "
                            f"gives, computes=Computes({field_name}=(...)) (docs/plugins.md, \"Declarations\")")


#: the three declarations' class attributes on a method, and their types
DECLARATIONS: dict[str, type] = {"requires": Requires, "sends": Sends, "computes": Computes}


def refuse_model_without_running_stats(cls: Any, model: nn.Module) -> None:
    """Raise ``ConfigError`` when ``cls`` reads BatchNorm running statistics (``requires.running_stats_model``) and
    ``model`` keeps none (the config's check names the model; this one also covers a method built directly)."""
    needed = cls.requires.running_stats_model
    if needed and not keeps_running_stats(model):
        raise ConfigError(f"method {cls.name} matches its synthetic images to the model's BatchNorm running "
                          f"statistics; {type(model).__name__} keeps none: set model.name: {needed}")


def refuse_scenario(cls: Any, scenario: str) -> None:
    """Raise ``ConfigError`` when ``cls`` declares its ``requires.scenarios`` and ``scenario`` (resolved; ``auto``:
    not known yet, let through) is not among them."""
    req = cls.requires
    if not req.scenarios or scenario == "auto" or scenario in req.scenarios:
        return
    kinds = " or ".join(f"{s}-incremental" for s in req.scenarios)
    why = f" ({req.scenarios_why})" if req.scenarios_why else ""
    raise ConfigError(f"method {cls.name} is {kinds} only{why}; the run's scenario is {scenario}: set "
                      f"stream.scenario: {req.scenarios[0]}")
