"""Where the methods' per-client state lives (``client_state_store``) and whether it fits the disk.

``auto`` keeps it in memory while the estimated state of all clients (bytes per client x ``num_clients``,
summed over the run's methods) stays within ``MEMORY_BYTES``, and puts it on disk
(:class:`cfl.engine.stores.disk_states.DiskClientStates`) beyond. A method's disk store holds its live state plus
the dead records of rewritten clients, which compaction keeps below the live bytes: at most twice the live
state plus one segment, and never more than the run writes in all (a round rewrites its sampled clients, a
task end every client; a run of two tasks writes every client once at its only task end). A run whose
estimate cannot fit the free space of the run directory's file system is refused before it starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from cfl.config.schema import ConfigError
from cfl.engine.stores.disk_states import SEGMENT_BYTES
from cfl.methods.hook_types import StateSizing

MEMORY_BYTES = 256 << 20  # a memory store is rewritten whole into every checkpoint: ~1 s at 256 MiB here
GB = 1e9


def choose_store(setting: str, total_bytes: int) -> str:
    """``memory`` or ``disk`` for ``client_state_store: setting`` and the estimated state of all clients."""
    if setting != "auto":
        return setting
    return "disk" if total_bytes > MEMORY_BYTES else "memory"


def disk_need(total_bytes: int, sizing: StateSizing) -> int:
    """Bytes one method's disk store may occupy for ``total_bytes`` of live state of all clients: the live
    state plus dead records, which are at most the live bytes (compaction) and at most what the run rewrites
    (every sampled client each round, every client at each task end but the first)."""
    per_client = total_bytes / max(sizing.num_clients, 1)
    rewritten = sizing.rounds * sizing.clients_per_round * per_client + max(sizing.num_tasks - 2, 0) * total_bytes
    return int(total_bytes + min(total_bytes, rewritten)) + min(SEGMENT_BYTES, total_bytes)


def free_bytes(path: Path) -> int:
    """Free bytes of the file system ``path`` is (or will be) on."""
    existing = Path(path).absolute()
    while not existing.exists():
        existing = existing.parent
    return shutil.disk_usage(existing).free


def check_disk(out: Path, totals: dict[str, int], sizing: StateSizing) -> None:
    """Refuse disk stores that cannot fit ``out``'s file system (``totals``: method -> estimated bytes of the
    state of all its clients; each method has its own store)."""
    total, num_clients = sum(totals.values()), sizing.num_clients
    need, free = sum(disk_need(b, sizing) for b in totals.values()), free_bytes(out)
    if need <= free:
        return
    parts = ", ".join(f"{name} ~{b / num_clients / 1e6:.2f} MB" for name, b in totals.items() if b)
    raise ConfigError(f"the methods' per-client state ({parts} per client) x num_clients={num_clients} is ~"
                      f"{total / GB:.1f} GB; on disk it needs up to {need / GB:.1f} GB (dead records between "
                      f"compactions, over {sizing.num_tasks} tasks and {sizing.rounds} rounds) but {out} has "
                      f"{free / GB:.1f} GB free. Lower num_clients, shrink the state "
                      f"(a smaller model, or the method's own options such as er.mem_per_client), or choose an "
                      f"--out on a larger disk")
