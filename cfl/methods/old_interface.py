"""The names of the method interface before issue #45's declarations, and what replaces each: a method class that
still defines one is refused when it is defined (:meth:`cfl.methods.base.Method.__init_subclass__`), naming each
old name it defines and its replacement (docs/plugins.md, "Declarations"). Data only: later steps add old hooks."""

from __future__ import annotations

#: where the replacements are described
DOCS = 'docs/plugins.md, "Declarations"'

#: old class attribute -> what replaces it
OLD_DECLARATIONS: dict[str, str] = {
    "broadcast": "sends=Sends(broadcast=...)",
    "downloads_model_at_task_end": "sends=Sends(downloads_model_at_task_end=...)",
    "client_events": "sends=Sends(client_events=...)",
    "server_task_end": "sends=Sends(server_task_end=...)",
    "ragged": "batching=Batching(ragged=...)",
    "sequential_reason": "batching=Batching(sequential_reason=...)",
    "models": "requires=Requires(models=...)",
    "running_stats_model": "requires=Requires(running_stats_model=...)",
    "backbone_only": "requires=Requires(model_train=...) (a backbone method is one with a model_train)",
    "model_train": "requires=Requires(model_train=...)",
    "scenarios": "requires=Requires(scenarios=...)",
    "scenarios_why": "requires=Requires(scenarios_why=...)",
    "schedules": "requires=Requires(schedules=...)",
    "schedules_why": "requires=Requires(schedules_why=...)",
    "unread_keys": "requires=Requires(unread_keys=...)",
}


def old_names_message(cls: type, base: type) -> str | None:
    """The refusal of a method class whose own or inherited attributes (not ``base``'s: the interface's own) use old
    names, or None."""
    found = [name for name in OLD_DECLARATIONS if any(name in vars(c) for c in cls.__mro__ if c not in (base, object))]
    if not found:
        return None
    fixes = "; ".join(f"{name} -> {OLD_DECLARATIONS[name]}" for name in found)
    return (f"method class {cls.__name__} uses the old declaration interface of {base.__name__}: {fixes} "
            f"(from cfl.plugin import Requires, Sends, Batching; {DOCS})")
