"""Which arguments a method's hook override takes (:func:`accepts`). ``method`` is a method (a
:class:`cfl.methods.base.Method`, which imports this module)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


@functools.cache
def _parameters(function: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    params = inspect.signature(function).parameters.values()
    return frozenset(p.name for p in params), any(p.kind is p.VAR_KEYWORD for p in params)


def accepts(method: object, hook: str, argument: str) -> bool:
    """Whether ``method``'s ``hook`` takes ``argument`` (by name, or ``**kwargs``): the engine passes a hook's optional
    arguments (``call``'s ``optional``) only to overrides that name them, so a plugin written before them runs
    unchanged."""
    names, var_keyword = _parameters(getattr(type(method), hook))
    return argument in names or var_keyword
