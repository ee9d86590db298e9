"""One process per run directory: an exclusive ``fcntl.flock`` on ``RUN_DIR/.cfl.lock``.

The kernel drops the lock when its holder exits in any way (SIGKILL included), so a killed run can be
resumed at once; the file stays and names the last holder (pid, host, start time) for the refusal.

The lock file is opened without following a symbolic link (a ``.cfl.lock`` that is a link, another hard link
of a file or not a regular file is refused, so cfl never truncates a file it does not own), and a lock that
was lost (the file deleted or replaced while the run holds it, so that a second process could lock a new
one) is found by :meth:`RunLock.check`, which the run calls before each line, checkpoint and output it writes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from cfl.config.schema import ConfigError

LOCK_FILE = ".cfl.lock"


class LockLost(RuntimeError):
    """The run's lock file was deleted or replaced while the run held it: another process may use the directory."""


class RunLock:
    """The lock a run holds on its directory; :meth:`check` raises :class:`LockLost` once it is no longer it.

    It is also a runner observer: each round, evaluation and task end checks the lock before the other
    observers write their lines."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir, self.fd = Path(run_dir), fd

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_FILE

    def check(self) -> None:
        mine = os.fstat(self.fd)
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            what = "was deleted" if now is None else "was replaced by another file"
            raise LockLost(f"the run directory's lock file {self.path} {what} while this run held it, so another "
                           f"cfl run may be using '{self.run_dir}' now (the lock keeps one run per directory; never "
                           f"delete {LOCK_FILE} of a running run)")

    def round_end(self, _record: dict[str, Any]) -> None:
        self.check()

    def evaluation(self, _record: dict[str, Any]) -> None:
        self.check()

    def task_end(self, _task: int, _record: dict[str, Any]) -> None:
        self.check()


def _open(run_dir: Path) -> int:
    """The lock file's descriptor, refusing (exit code 2) a link or anything but a cfl lock file."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(f"--out {run_dir}: its lock file {path} is a symbolic link (to "
                              f"{os.readlink(path)!r}); cfl does not follow it, so that it never overwrites the "
                              f"file it points to. Remove the link ({path}) and run again") from None
        raise ConfigError(f"--out {run_dir}: cannot create its lock file {LOCK_FILE} ({err.strerror}); "
                          f"choose a writable --out") from None
    info = os.fstat(fd)
    problem = ("is not a regular file" if not stat.S_ISREG(info.st_mode)
               else f"has {info.st_nlink} hard links (another name of the same file)" if info.st_nlink != 1 else "")
    if problem:
        os.close(fd)
        raise ConfigError(f"--out {run_dir}: its lock file {path} {problem}; cfl writes its lock there and never "
                          f"into a file it does not own. Remove {path} and run again")
    return fd


@contextmanager
def locked(run_dir: Path) -> Iterator[RunLock]:
    """Hold ``run_dir``'s lock while the block runs; refuse (exit code 2) when another process holds it."""
    fd = _open(run_dir)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "it is just starting"
            raise ConfigError(f"run directory '{run_dir}' is in use by another cfl run ({holder}); wait for it "
                              f"to end or stop it, or choose another --out") from None
        lock = RunLock(Path(run_dir), fd)
        try:
            lock.check()  # removed between the open and the flock by a run that just ended with nothing kept
        except LockLost:
            raise ConfigError(f"run directory '{run_dir}': its lock file was removed while this run was taking it "
                              f"(another cfl run just used the directory); run again") from None
        started = datetime.now().astimezone().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, started {started}\n".encode(), 0)
        yield lock
    finally:
        os.close(fd)  # releases the lock
