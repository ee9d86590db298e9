"""When registering a taken name replaces its entry: the *same definition* registered again, as when a notebook
cell that defines and registers a class is re-run, or ``cfl.run(..., plugins=[file])`` imports an edited file
again. Any other entry under a taken name is refused (docs/python-api.md, "Registering again")."""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass


class ReplacedRegistration(UserWarning):
    """A registry entry replaced by the same definition registered again (shown every time it happens)."""


@dataclass(frozen=True)
class Definition:
    """Where a class or function was defined: its module's name, its qualified name, and the module's file
    (absolute; ``None`` for a module without one, such as a notebook's ``__main__``)."""

    module: str
    qualname: str
    file: str | None

    def __str__(self) -> str:
        return f"{self.qualname} in {self.file or f'module {self.module}'}"


def definition_of(obj: object) -> Definition | None:
    """The definition of a class or function (``None`` for anything else: such an entry is never the same)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    file = getattr(sys.modules.get(module), "__file__", None)
    return Definition(module, qualname, os.path.abspath(file) if isinstance(file, str) else None)


def warn_replaced(kind: str, name: str, definition: Definition) -> None:
    """Say that ``name`` now holds the new ``definition`` (never deduplicated: each replacement is said)."""
    warnings.warn_explicit(f"{kind} '{name}' registered again by the same definition ({definition}): the new one "
                           "replaces it", ReplacedRegistration, filename=definition.file or definition.module,
                           lineno=0, module=definition.module, registry=None)
