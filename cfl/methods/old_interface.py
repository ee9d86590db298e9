"""The names of the method interface before its declarations and hooks became concepts, and what replaces each: a
method class that still defines one is refused when it is defined (:meth:`cfl.methods.base.Method.__init_subclass__`),
naming each old name it defines and its replacement, and so is a hook written with the old arguments in place of its
one context object (docs/plugins.md, "Declarations" and "Hooks")."""

from __future__ import annotations

import inspect

#: where the replacements are described
DOCS = 'docs/plugins.md, "Declarations"'
HOOKS_DOCS = 'docs/plugins.md, "The hooks"'

#: old class attribute -> what replaces it
OLD_DECLARATIONS: dict[str, str] = {
    "broadcast": "sends=Sends(broadcast=...)",
    "downloads_model_at_task_end": "sends=Sends(downloads_model_at_task_end=...)",
    "client_events": "sends=Sends(client_events=...)",
    "server_task_end": "sends=Sends(server_task_end=...)",
    "ragged": "computes=Computes(ragged=...)",
    "sequential_reason": "computes=Computes(sequential_reason=...)",
    "models": "requires=Requires(models=...)",
    "running_stats_model": "requires=Requires(running_stats_model=...)",
    "backbone_only": "requires=Requires(model_train=...) (a backbone method is one with a model_train)",
    "model_train": "requires=Requires(model_train=...)",
    "scenarios": "requires=Requires(scenarios=...)",
    "scenarios_why": "requires=Requires(scenarios_why=...)",
    "schedules": "requires=Requires(schedules=...)",
    "schedules_why": "requires=Requires(schedules_why=...)",
    "unread_keys": "requires=Requires(unread_keys=...)",
    "losses": "computes=Computes(losses=...)",
    "draws": "computes=Computes(draws=...)",
    "terms": "computes=Computes(terms=...)",
    "starts": "computes=Computes(starts=...)",
}


#: old hook -> what replaces it; refused once the old name is no longer a hook of the interface
OLD_HOOKS: dict[str, str] = {
    "local_params": "param_roles(ctx) -> ParamRoles(local=...)",
    "frozen_params": "param_roles(ctx) -> ParamRoles(frozen=...)",
    "local_steps_per_epoch": "client_start(ctx) -> ClientStart(steps=...) (computes=Computes(starts=('steps',)))",
    "carry_start": "client_start(ctx) -> ClientStart(carry=...) (computes=Computes(starts=('carry',)))",
    "penalty": "round_terms(ctx) -> RoundTerms(penalty=...)",
    "layer_preconditioner": "round_terms(ctx) -> RoundTerms(preconditioner=...)",
    "gradient_projection": "round_terms(ctx) -> RoundTerms(projection=...)",
    "task_loss": "loss(ctx) -> LossTerms(task=...)",
    "extra_loss": "loss(ctx) -> LossTerms(extra=...)",
    "replay": "samples(ctx) -> Draw(replay=...)",
    "step_samples": "samples(ctx) -> Draw(step=...)",
    "upload_bytes": "count_bytes(ctx) (ctx.kind names what is counted)",
    "payload_bytes": "count_bytes(ctx) (ctx.kind names what is counted)",
    "client_state_bytes": "count_bytes(ctx) (ctx.kind names what is counted)",
    "server_start": "server_event(ctx) (ctx.event names the moment)",
    "before_task_end": "server_event(ctx) (ctx.event names the moment)",
    "server_end": "server_event(ctx) (ctx.event names the moment)",
    "after_server_step": "server_event(ctx) -> ServerChange(params=...)",
    "backbone_update": "server_event(ctx) -> ServerChange(backbone=...)",
}


def _positional(function: object) -> int:
    """Positional parameters of a function, ``self`` included."""
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in inspect.signature(function).parameters.values())  # type: ignore[arg-type]


def old_hooks_message(cls: type, base: type) -> str | None:
    """The refusal of a method class that defines an old hook, or a hook of ``base`` that takes one context object
    written with more arguments, or None."""
    own = {name: value for c in reversed(cls.__mro__) if c not in (base, object) for name, value in vars(c).items()}
    found = [f"{name} -> {OLD_HOOKS[name]}" for name in OLD_HOOKS if name in own and not hasattr(base, name)]
    for name, value in own.items():
        hook = getattr(base, name, None)
        if (callable(value) and inspect.isfunction(hook) and not name.startswith("_") and _positional(hook) == 2
                and inspect.isfunction(value) and _positional(value) != 2):
            found.append(f"{name}({', '.join(list(inspect.signature(value).parameters)[1:])}) -> {name}(ctx), one "
                         "context object")
    if not found:
        return None
    return (f"method class {cls.__name__} defines hooks of the old interface of {base.__name__}: {'; '.join(found)} "
            f"(from cfl.plugin import ...; {HOOKS_DOCS})")


def old_names_message(cls: type, base: type) -> str | None:
    """The refusal of a method class whose own or inherited attributes (not ``base``'s: the interface's own) use old
    names, or None."""
    found = [name for name in OLD_DECLARATIONS if any(name in vars(c) for c in cls.__mro__ if c not in (base, object))]
    if not found:
        return None
    fixes = "; ".join(f"{name} -> {OLD_DECLARATIONS[name]}" for name in found)
    return (f"method class {cls.__name__} uses the old declaration interface of {base.__name__}: {fixes} "
            f"(from cfl.plugin import Requires, Sends, Computes; {DOCS})")
