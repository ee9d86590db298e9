"""The file system's name limits, checked for a run directory before anything is made or written in it: a
component longer than ``NAME_MAX`` (usually 255 bytes) or a path longer than ``PATH_MAX`` (usually 4096)
would otherwise end a run in an ``OSError 36`` traceback."""

from __future__ import annotations

import os
from pathlib import Path

from cfl.config.schema import ConfigError

#: bytes kept free below PATH_MAX for the files cfl writes inside a run directory: the longest, a client-state
#: segment under ``client_states/`` or a plot's temporary name (the plot's name and 8 random characters), are
#: about 30
INSIDE = 64


def _limit(existing: str, name: str, default: int) -> int:
    try:
        return os.pathconf(existing, name)
    except (OSError, ValueError):  # not known for this file system: POSIX's usual values
        return default


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path):  # os.path.exists is False, not an error, for a name that is too long
        path = os.path.dirname(path)
    return path


def check_path_length(out: Path) -> None:
    """Refuse the run directory ``out`` if one of its names or the whole path, with room for the files of a
    run, is longer than its file system allows."""
    text = str(out)
    what = f"run directory '{text if len(text) <= 80 else text[:60] + '...'}'"
    absolute = os.path.abspath(out)
    existing = _nearest_existing(absolute)
    name_max = _limit(existing, "PC_NAME_MAX", 255)
    for part in Path(absolute).parts:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"{what}: the name '{part[:40]}...' is {len(os.fsencode(part))} bytes long; the file "
                              f"system allows {name_max} per name (NAME_MAX); choose a shorter --out (the default "
                              "run directory is named after the stream, the methods and the partitioner)")
    path_max = _limit(existing, "PC_PATH_MAX", 4096)
    if len(os.fsencode(absolute)) + INSIDE > path_max:
        raise ConfigError(f"{what}: the path is {len(os.fsencode(absolute))} bytes long; with the {INSIDE} a run "
                          f"needs inside it, that is more than the file system's {path_max} (PATH_MAX); choose a "
                          "shorter --out")
