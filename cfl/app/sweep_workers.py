"""Worker processes of ``cfl sweep --jobs N``: they die with the sweep and stop when the sweep is stopped.

Each worker leaves the terminal's process group (``os.setpgrp``), so a Ctrl-C reaches only the sweep, which
sends it on to every worker once (:class:`SweepStop`): a worker in a run stops after its round with a
checkpoint (a second signal: at once), an idle worker remembers it and starts no run. The sweep itself starts
no run after a signal and ends, once its running runs have stopped or finished, with 128 + the signal number.
A worker asks the kernel to kill it when the sweep process dies (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``;
elsewhere a thread watching the parent's pid), so a ``SIGKILL`` of the sweep leaves no worker behind, and with
the workers gone the multiprocessing resource tracker, whose pipe they held, ends too: ``cfl sweep ... | tee``
returns. A killed run's checkpoint is valid (it is replaced atomically) and resumes with the sweep.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from cfl.engine.rounds.stop import SIGNALS, RunStopped, SignalInterrupt, signal_exit_code

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_pending: list[int] = []  # signals this worker got while idle
_busy = False  # a run is going in this worker


def init_worker(threads: int, parent: int) -> None:
    """The pool's initializer: leave the terminal's process group, die with ``parent``, handle signals."""
    import torch

    os.setpgrp()
    _die_with(parent)
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)
    torch.set_num_threads(threads)


def _die_with(parent: int) -> None:
    watched = False
    if sys.platform.startswith("linux"):
        try:
            watched = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            watched = False
    if os.getppid() != parent:  # the sweep died before the kernel was told
        os._exit(1)
    if not watched:
        threading.Thread(target=_watch, args=(parent,), daemon=True, name="cfl-parent-watch").start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    """Outside a run's own handler (between runs, before a run has installed it): a busy worker stops at once,
    an idle one starts no further run."""
    if _busy:
        raise SignalInterrupt(signum)
    _pending.append(signum)


def run_in_worker(job: Any, *args: Any) -> Any:
    """``job(*args)`` (:func:`cfl.app.sweep.run_job`) unless a signal came first; a signal outside the run's own
    handler is a :class:`RunStopped` with its exit code."""
    global _busy
    _busy = True
    try:
        if _pending:
            raise RunStopped(f"not started: the sweep was stopped by {signal.Signals(_pending[0]).name}",
                             128 + _pending[0])
        return job(*args)
    except KeyboardInterrupt as err:
        code = signal_exit_code(err)
        raise RunStopped(f"stopped at once by {signal.Signals(code - 128).name}", code) from None
    finally:
        _busy = False


class SweepStop:
    """The sweep's signal handler while workers run: remember the first signal, send each on to the workers."""

    def __init__(self, workers: Any) -> None:
        self.workers = workers  # () -> the worker pids
        self.signum: int | None = None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"\ncfl: {signal.Signals(signum).name} received: the sweep starts no further run; the running "
                  f"runs stop after their round with a checkpoint (send it again to stop them at once)",
                  file=sys.stderr, flush=True)
        for pid in self.workers():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def install(self) -> dict[int, Any]:
        """Install the handler (main thread only); the handlers it replaced, for :meth:`restore`."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, self._handle) for s in SIGNALS}

    @staticmethod
    def restore(previous: dict[int, Any]) -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)
