"""Run directories: checked before any work, cleared only after everything that can refuse has run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cfl.engine import checkpoint
from cfl.engine.lock import LOCK_FILE
from cfl.schema import ConfigError

CLIENT_STATES = "client_states"  # the disk client-state store (cfl/engine/disk_states.py)
OUTPUT_FILES = ("results.json", "metrics.jsonl", "config.yaml", "acc_matrix.png", "accuracy_curve.png",
                "task_accuracy.png", checkpoint.CHECKPOINT)


def check_writable(out: Path) -> None:
    """Refuse a run directory that is a file, lies under a file, or cannot be written (exit code 2)."""
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


def holds_outputs(out: Path) -> bool:
    return out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir())


def refuse_outputs(out: Path, overwrite: bool) -> None:
    """Refuse to replace an earlier run's outputs unless ``overwrite`` (nothing is deleted here)."""
    if holds_outputs(out) and not overwrite:
        unfinished = (out / checkpoint.CHECKPOINT).is_file() and not (out / "results.json").is_file()
        hint = f", or continue that unfinished run with: cfl run --resume {out}" if unfinished else ""
        raise ConfigError(f"run directory '{out}' already holds outputs; pass --overwrite to replace them "
                          f"or --out to choose another directory{hint}")


def clear_outputs(out: Path) -> None:
    """Delete an earlier run's outputs (``--overwrite``), once the new run has loaded and built everything."""
    for name in OUTPUT_FILES:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "wandb", ignore_errors=True)
    shutil.rmtree(out / CLIENT_STATES, ignore_errors=True)


def make(out: Path) -> bool:
    """Create ``out`` (and its parents); True when it did not exist before."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot create it ({err.strerror}); choose another --out") from None
    return created


def remove_if_empty(out: Path) -> None:
    """Remove a directory this run created and left nothing in but its lock file."""
    if out.is_dir() and not holds_outputs(out):
        (out / LOCK_FILE).unlink(missing_ok=True)
        out.rmdir()
