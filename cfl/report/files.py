"""Atomic file writes: a crash mid-write never leaves a half-written results file; and the checks that an
output directory can be made and written, before any work.

The file gets the permissions of any file the user creates (``0o666`` less the umask, e.g. ``0644``), not
the ``0600`` of the temporary file it is written as, so colleagues on a shared cluster can read results.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from cfl.config.schema import ConfigError


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc/self/status``); elsewhere
    set and restored at once (``os.umask`` can only be read by setting it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None and err.filename is None:  # name the file
            err.filename = str(path)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(_clean(obj), indent=2) + "\n").encode())


def json_line(obj: Any) -> str:
    return json.dumps(_clean(obj)) + "\n"


def check_searchable(out: Path, flag: str = "--out") -> None:
    """Refuse a path under a directory this process may not search (no ``x`` permission), where every look
    at the path would fail with a permission error (exit code 2)."""
    for parent in reversed(Path(os.path.abspath(out)).parents):
        if parent.is_dir() and not os.access(parent, os.X_OK):
            raise ConfigError(f"{flag} {out}: cannot look inside {parent} (no search permission, the x bit, for "
                              f"this user); choose another {flag} or ask for access (chmod +x {parent})")


def check_writable(out: Path) -> None:
    """Refuse a run directory that is a file, lies under a file or an unsearchable directory, or cannot be
    written (exit code 2)."""
    check_searchable(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory; choose another --out")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--out {out}: {existing} is a file, so no directory can be made under it; "
                          f"choose another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {existing} is not writable (read-only directory or file system); "
                          f"choose another --out")
