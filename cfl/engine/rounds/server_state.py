"""What a method's server state sends and holds, shared by the round loop (cfl/engine/rounds/runner.py), the
task ends (cfl/engine/rounds/task_end.py) and the dry call (cfl/engine/rounds/preflight.py): the keys a
method broadcasts at an event and a payload's bytes."""

from __future__ import annotations

from cfl.engine.hook_call import call
from cfl.engine.hook_rules import check_bytes
from cfl.methods.base import Method
from cfl.methods.traffic_hooks import Payload, PayloadKind
from cfl.tensors import State, nbytes


def broadcast_of(method: Method, event: str, server: State) -> State:
    """The server-state keys ``method`` declares it sends at ``event`` (those the server holds)."""
    return {k: server[k] for k in method.sends.broadcast.get(event, ()) if k in server}


def counted(method: Method, ctx: Payload) -> int | None:
    """``method.count_bytes(ctx)``, checked: its bytes of ``ctx``, or None (the default; also where it does not
    override the hook)."""
    return call(method, "count_bytes", ctx, use=check_bytes, default=None)


def payload_size(method: Method, kind: PayloadKind, payload: State) -> int:
    """Bytes of one payload of ``method``: its ``count_bytes`` where it counts them, else every tensor's."""
    size = counted(method, Payload(kind, payload=payload)) if payload else None
    return nbytes(payload) if size is None else size
