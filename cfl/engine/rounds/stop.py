"""Stop cleanly on Ctrl-C (SIGINT) or SIGTERM: finish the current round, checkpoint, then exit.

Until training starts (imports, data loading, building, the round-0 checkpoint) a signal stops at once:
there is nothing to save yet. From then on the first signal only sets a flag that the runner polls after
every round (``Runner.should_stop``); the run then writes a checkpoint and stops, or, when training is
over, finishes writing its outputs. A second signal stops at once (the last checkpoint stays). Either way
the exit code is 128 + the number of the signal that stopped the run.
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
    """The run stopped before its end (signal, non-finite values, full disk); its last checkpoint is kept."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type[RunStopped], tuple[str, int]]:
        """Rebuilt with its exit code when it crosses a process boundary (``cfl sweep --jobs``, Ray)."""
        return type(self), (str(self), self.exit_code)


class SignalInterrupt(KeyboardInterrupt):
    """A signal that stops the run at once; ``signum`` gives the exit code (128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_exit_code(err: KeyboardInterrupt) -> int:
    return 128 + int(getattr(err, "signum", signal.SIGINT))


class StopRequest:
    """A callable flag for ``Runner.should_stop``, raised by SIGINT/SIGTERM while ``installed``."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferred = False  # True once training has started: the first signal waits for the round's end

    def __call__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def defer(self) -> None:
        """From now on the first signal stops after the current round (there is a checkpoint to resume)."""
        self.deferred = True

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None or not self.deferred:
            raise SignalInterrupt(signum)
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
