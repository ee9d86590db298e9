"""W&B sweep and run ids, checked before cfl puts them in a path or hands them to ``wandb.init``.

W&B's own ids are 8 lowercase letters and digits; a user may choose a run id (``WANDB_RUN_ID``). Admitted:
letters, digits, ``-``, ``_`` and ``.``, at most 128 characters, not starting with ``.`` and without ``..``,
so an id can never leave the directory it names (``runs/sweep-<sweep id>/...-<run id>``).
"""

from __future__ import annotations

import re

from cfl.config.schema import ConfigError

SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")


def is_safe_id(value: object) -> bool:
    return isinstance(value, str) and SAFE_ID.fullmatch(value) is not None and ".." not in value


def checked_id(value: object, where: str, fix: str) -> object:
    """``value`` when :func:`is_safe_id`, else a :class:`ConfigError` naming ``where`` it came from and ``fix``."""
    if not is_safe_id(value):
        raise ConfigError(f"{where} {value!r} is not a W&B id: ids are letters, digits, '-', '_' and '.' (at most "
                          f"128, not starting with '.', no '..' and no path separator), and cfl uses them in paths; "
                          f"{fix}")
    return value
