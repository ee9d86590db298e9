"""Stop cleanly on Ctrl-C (SIGINT) or SIGTERM: finish the current round, checkpoint, then exit.

The first signal only sets a flag that the runner polls after every round (``Runner.should_stop``); the
run then writes a checkpoint and stops. A second signal interrupts at once (the last checkpoint stays).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunStopped(Exception):
    """The run stopped before its end (signal or non-finite values); its last checkpoint is kept."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type[RunStopped], tuple[str, int]]:
        """Rebuilt with its exit code when it crosses a process boundary (``cfl sweep --jobs``, Ray)."""
        return type(self), (str(self), self.exit_code)


class StopRequest:
    """A callable flag for ``Runner.should_stop``, raised by SIGINT/SIGTERM while ``installed``."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\ncfl: {signal.Signals(signum).name} received: stopping after this round with a checkpoint "
              f"(send it again to stop at once)", file=sys.stderr, flush=True)

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Catch the signals while the block runs (main thread only; elsewhere this is a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
