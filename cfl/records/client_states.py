"""Every client's method state, behind one small interface the engine reads and writes through, and a method's
whole state (:class:`MethodState`: its server state and its clients').

A client's state is a (nested) dict of tensors that one method made for that client. The engine takes it
out with :meth:`ClientStates.get`, hands it to the method's hooks and writes it back with
:meth:`ClientStates.put`, so the on-disk store (:class:`cfl.engine.stores.disk_states.DiskClientStates`, chosen by
``client_state_store``) can replace this in-memory one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cfl.tensors import State, nbytes


class ClientStates:
    """Client id -> state dict, held in memory; a client never written has the empty state ``{}``."""

    kind = "memory"

    def __init__(self, states: dict[int, State] | None = None) -> None:
        self._states: dict[int, State] = {int(c): s for c, s in (states or {}).items() if s}

    def get(self, cid: int) -> State:
        """The client's state (a fresh empty dict for a client without one); write changes back with ``put``."""
        return self._states.get(int(cid), {})

    def put(self, cid: int, state: State) -> None:
        """Store the client's state; an empty dict removes it."""
        if state:
            self._states[int(cid)] = state
        else:
            self._states.pop(int(cid), None)

    def ids(self) -> list[int]:
        """The clients holding a state, sorted."""
        return sorted(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def nbytes(self, cid: int) -> int:
        """Bytes of the client's state (:func:`cfl.tensors.nbytes`; 0 without one)."""
        return nbytes(self._states.get(int(cid), {}))

    def state_dict(self) -> dict[int, State]:
        return dict(self._states)

    def committed(self) -> None:
        """The checkpoint holding the last ``state_dict`` is durable (nothing to do in memory)."""

    def load_state_dict(self, data: dict[Any, State]) -> None:
        if data.get("store") == "disk":
            raise ValueError("the checkpoint keeps them on disk (the run directory's client_states/); resume with "
                             "--set client_state_store=disk")
        self._states = {int(c): s for c, s in data.items() if s}


@dataclass
class MethodState:
    """Everything a method remembers: server state and the clients' states."""

    server: State = field(default_factory=dict)
    clients: ClientStates = field(default_factory=ClientStates)

    def state_dict(self) -> dict[str, Any]:
        return {"server": self.server, "clients": self.clients.state_dict()}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.server = data["server"]
        self.clients.load_state_dict(data["clients"])
