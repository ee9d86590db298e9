"""What a run records of its methods so that reports label it without the plugin files that registered them
(``results.json``'s ``method_info``; :mod:`cfl.report.labels` reads it): each method's display name (its
``about`` up to the colon: ``FedProx``) and its parameters' defaults."""

from __future__ import annotations

import dataclasses
from typing import Any

#: per method name: ``{"display": "FedProx", "defaults": {"mu": 0.01}}``
MethodInfo = dict[str, dict[str, Any]]


def registered_defaults(name: str) -> dict[str, Any]:
    """The parameters of the method registered as ``name`` with their defaults ({} for none registered)."""
    from cfl.methods import METHODS

    cls = METHODS.get(name)
    if cls is None:
        return {}
    return {f.name: f.default for f in dataclasses.fields(cls.Hyperparams) if f.default is not dataclasses.MISSING}


def registered_display(name: str) -> str:
    """The display name of the method registered as ``name`` (``name`` itself for none, or no colon)."""
    from cfl.methods import METHODS

    cls = METHODS.get(name)
    about = getattr(cls, "about", "") if cls is not None else ""
    return about.split(":")[0].strip() if ":" in about else name


def method_info(names: list[str]) -> MethodInfo:
    """Each of the run's methods (method and plugins) with its display name and defaults, from this process."""
    return {name: {"display": registered_display(name), "defaults": registered_defaults(name)} for name in names}
