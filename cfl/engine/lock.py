"""One process per run directory: an exclusive ``fcntl.flock`` on ``RUN_DIR/.cfl.lock``.

The kernel drops the lock when its holder exits in any way (SIGKILL included), so a killed run can be
resumed at once; the file stays and names the last holder (pid, host, start time) for the refusal.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from cfl.schema import ConfigError

LOCK_FILE = ".cfl.lock"


@contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock while the block runs; refuse (exit code 2) when another process holds it."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise ConfigError(f"--out {run_dir}: cannot create its lock file {LOCK_FILE} ({err.strerror}); "
                          f"choose a writable --out") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "it is just starting"
            raise ConfigError(f"run directory '{run_dir}' is in use by another cfl run ({holder}); wait for it "
                              f"to end or stop it, or choose another --out") from None
        started = datetime.now().astimezone().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, started {started}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
