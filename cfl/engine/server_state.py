"""What a method's server state sends and holds, shared by the round loop (cfl/engine/runner.py), the
task ends (cfl/engine/task_end.py) and the dry call (cfl/engine/preflight.py): the keys a
method broadcasts at an event, a payload's bytes, and the check that a server state stays fit for a checkpoint."""

from __future__ import annotations

from cfl.engine.checkpoint import CheckpointError, check_plain
from cfl.engine.hook_rules import PLAIN_STATE, check_bytes
from cfl.methods.base import Method, overrides
from cfl.methods.hook_guard import BrokenRule, guarded
from cfl.tensors import State, nbytes


def plain_server(method: Method, hook: str, server: State) -> None:
    """Refuse a server state that ``method.hook`` left unfit for a checkpoint (a function, a module, a numpy array:
    :func:`cfl.engine.checkpoint.check_plain`), naming the hook, before the next checkpoint would fail on it."""
    try:
        check_plain(server, "server")
    except CheckpointError as err:
        with guarded(method, hook):
            raise BrokenRule(f"{PLAIN_STATE}; {str(err).split(';')[0]}") from None


def broadcast_of(method: Method, event: str, server: State) -> State:
    """The server-state keys ``method`` declares it sends at ``event`` (those the server holds)."""
    return {k: server[k] for k in method.sends.broadcast.get(event, ()) if k in server}


def payload_size(method: Method, kind: str, payload: State) -> int:
    """Bytes of one payload of ``method``: its ``payload_bytes`` where it counts them, else every tensor's."""
    if overrides(method, "payload_bytes") and payload:
        with guarded(method, "payload_bytes"):
            size = method.payload_bytes(kind, payload)
            if size is not None:
                return check_bytes(size)
    return nbytes(payload)
