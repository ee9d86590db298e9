"""Every client's method state, behind one small interface the engine reads and writes through.

A client's state is a (nested) dict of tensors that one method made for that client. The engine takes it
out with :meth:`ClientStates.get`, hands it to the method's hooks and writes it back with
:meth:`ClientStates.put`, so another store (on disk, say) can replace this in-memory one.
"""

from __future__ import annotations

from typing import Any

from cfl.tensors import State


class ClientStates:
    """Client id -> state dict, held in memory; a client never written has the empty state ``{}``."""

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

    def state_dict(self) -> dict[int, State]:
        return dict(self._states)

    def load_state_dict(self, data: dict[Any, State]) -> None:
        self._states = {int(c): s for c, s in data.items() if s}
