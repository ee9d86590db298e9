"""One line for a failure of the user's code (a plugin file, a hook, a ``stream.benchmark`` callable): what
cfl prints instead of a traceback (``CFL_TRACEBACK=1`` prints the traceback too)."""

from __future__ import annotations

import os
import sys
import traceback

#: what user code may raise that cfl turns into a refusal or a stop: ``SystemExit`` too (``sys.exit`` in a
#: plugin must not end cfl silently), never ``KeyboardInterrupt`` (Ctrl-C and SIGTERM keep their meaning)
USER_FAILURES = (Exception, SystemExit)


def one_line(err: BaseException) -> str:
    """``TypeError: message`` (its first line), or what a ``SystemExit`` means."""
    if isinstance(err, SystemExit):
        return f"it called sys.exit({err.code!r}) (SystemExit), which would end cfl without a word"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def line_in(err: BaseException, file: str) -> int | None:
    """The last line of ``file`` in ``err``'s traceback (where the user's code raised or called what raised)."""
    lines = [lineno for frame, lineno in traceback.walk_tb(err.__traceback__) if frame.f_code.co_filename == file]
    return lines[-1] if lines else None


def show_traceback(err: BaseException) -> None:
    """Print ``err``'s traceback on stderr when ``CFL_TRACEBACK=1`` (the one-line message is printed anyway)."""
    if os.environ.get("CFL_TRACEBACK") == "1":
        traceback.print_exception(err, file=sys.stderr)
