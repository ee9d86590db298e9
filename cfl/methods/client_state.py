"""Size of the per-client method state (Fisher, anchors, memories, bases) for ``method_stats``."""

from __future__ import annotations

from typing import Any

from cfl.methods.base import MethodState
from cfl.metrics.comm import nbytes


def client_state_bytes(state: MethodState) -> dict[str, Any]:
    """Bytes each client keeps: mean and max over the clients that hold any state, and their count."""
    sizes = [nbytes(s) for s in state.clients.values() if s]
    if not sizes:
        return {"client_state_bytes_mean": 0.0, "client_state_bytes_max": 0, "clients_with_state": 0}
    return {"client_state_bytes_mean": sum(sizes) / len(sizes), "client_state_bytes_max": max(sizes),
            "clients_with_state": len(sizes)}
