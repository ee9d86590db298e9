"""Run directories: checked before any work, cleared only after everything that can refuse has run.

cfl marks each run directory it writes with ``.cfl-run`` (a small JSON file, written before any output), and
``--overwrite`` replaces only a marked directory: a directory of the user's own files (``--out .``) is refused.
A run directory of a cfl from before the marker is refused too; the message says how to mark it.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path

from cfl import __version__
from cfl.config.schema import ConfigError
from cfl.engine.stores import checkpoint
from cfl.engine.stores.lock import LOCK_FILE
from cfl.plugin_files import resume_command
from cfl.report.files import atomic_write_bytes

CLIENT_STATES = "client_states"  # the disk client-state store (cfl/engine/stores/disk_states.py)
MARKER = ".cfl-run"  # a run directory cfl made; only such a directory may be overwritten
BOOKKEEPING = (LOCK_FILE, MARKER)  # files of a run directory that are not outputs
OUTPUT_FILES = ("results.json", "metrics.jsonl", "config.yaml", "acc_matrix.png", "accuracy_curve.png",
                "task_accuracy.png", checkpoint.CHECKPOINT)


def check_state_dirs(out: Path) -> None:
    """Refuse a run directory whose disk client-state store cannot be written (exit code 2): a resumed run
    appends records there and removes those no checkpoint names; ``--overwrite`` deletes them."""
    root = out / CLIENT_STATES
    if not root.is_dir():
        return
    for folder in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"run directory '{out}': {folder} is not writable (read-only directory or file "
                              f"system), and the disk client-state store writes and removes its records there; "
                              f"make it writable (chmod -R u+w {root}) and run again")


def holds_outputs(out: Path) -> bool:
    return out.is_dir() and any(p.name not in BOOKKEEPING for p in out.iterdir())


def check_marker(out: Path) -> None:
    """Refuse a ``.cfl-run`` that is a directory (or another non-file: a socket, a pipe): it is no marker, and
    cfl could not write its own over it (exit code 2, nothing deleted). A link is replaced by the marker."""
    marker = out / MARKER
    if marker.is_symlink() or not marker.exists() or marker.is_file():
        return
    kind = "a directory" if marker.is_dir() else "not a regular file"
    fix = f"rmdir {marker}" if marker.is_dir() and not any(marker.iterdir()) else f"move {marker} away"
    raise ConfigError(f"run directory '{out}': {marker} is {kind}, not the small file cfl writes to mark its run "
                      f"directories, so '{out}' is not taken as a cfl run directory and nothing in it is deleted or "
                      f"written; {fix} (or choose another --out)")


def is_marked(out: Path) -> bool:
    """``out`` is a run directory cfl made (its marker is a regular file, not a link)."""
    return (out / MARKER).is_file() and not (out / MARKER).is_symlink()


def mark(out: Path) -> bool:
    """Mark ``out`` as a cfl run directory; True when this call wrote the marker."""
    if is_marked(out):
        return False
    made = datetime.now().astimezone().isoformat(timespec="seconds")
    atomic_write_bytes(out / MARKER, json.dumps({"cfl_run_directory": True, "cfl_version": __version__,
                                                 "marked": made}).encode() + b"\n")
    return True


def refuse_outputs(out: Path, overwrite: bool) -> None:
    """Refuse to replace an earlier run's outputs unless ``overwrite``, and to replace anything in a directory
    cfl did not mark as a run directory (nothing is deleted here)."""
    if not holds_outputs(out):
        return
    if not overwrite:
        unfinished = (out / checkpoint.CHECKPOINT).is_file() and not (out / "results.json").is_file()
        hint = f", or continue that unfinished run with: {resume_command(out)}" if unfinished else ""
        raise ConfigError(f"run directory '{out}' already holds outputs; pass --overwrite to replace them "
                          f"or --out to choose another directory{hint}")
    if not is_marked(out):
        raise ConfigError(f"--overwrite: '{out}' holds files but is not a cfl run directory (it has no {MARKER} "
                          f"file; cfl marks each run directory it makes and replaces only those), so nothing in it "
                          f"is deleted. Choose a new or empty --out, or empty '{out}' yourself. If it is a run "
                          f"directory of an older cfl (made before the marker existed), mark it first: "
                          f"touch {out}/{MARKER}")


def clear_outputs(out: Path) -> None:
    """Delete an earlier run's outputs (``--overwrite``), once the new run has loaded and built everything."""
    for name in OUTPUT_FILES:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "wandb", ignore_errors=True)
    shutil.rmtree(out / CLIENT_STATES, ignore_errors=True)


def make(out: Path) -> Path | None:
    """Create ``out`` (and its parents); the topmost directory this created (``runs/`` for a first default run
    directory), or None when ``out`` existed."""
    top = None
    for missing in (out, *out.parents):
        if missing.exists():
            break
        top = missing
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot create it ({err.strerror}); choose another --out") from None
    return top


def remove_if_empty(out: Path, top: Path) -> None:
    """Remove a directory this run created and left nothing in but its lock file and marker, and the empty
    parents it created with it, up to ``top``."""
    if not out.is_dir() or holds_outputs(out):
        return
    for name in BOOKKEEPING:
        (out / name).unlink(missing_ok=True)
    for created in (out, *out.parents):
        if next(created.iterdir(), None) is not None:
            return
        created.rmdir()
        if created == top:
            return
