"""``keep_client_states: false``: a finished run drops its methods' per-client state.

The state of every client (EWC's Fisher and anchor, ER's memory, ...) is what a resumed run needs and nothing
else reads once ``results.json`` is written (its ``method_stats`` are computed before). Dropping it replaces the
client states in ``checkpoint.pt`` by a mark (:func:`cfl.engine.stores.checkpoint.dropped`; ``--resume`` then refuses,
naming it) and deletes the disk store, ``client_states/``. A run whose methods held no client state keeps its
checkpoint as it is (it still resumes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint
from cfl.engine.stores.lock import RunLock
from cfl.engine.stores.rundir import CLIENT_STATES


def drop_client_states(runner: Runner, out: Path, wandb_run_id: str | None, lock: RunLock) -> str:
    """Drop the finished run's client states (checkpoint first, then the files); what was dropped, to print."""
    kept_per_client = [c for c in (runner.optimizer_states, runner.buffer_states) if c is not None]
    held = sum(len(st.clients) for st in runner.states) + sum(len(c) for c in kept_per_client)
    store = out / CLIENT_STATES
    on_disk = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) if store.is_dir() else 0
    if not held and not store.exists():
        return "cfl: keep_client_states: false: the methods held no client state; nothing to drop"
    size = sum(st.clients.nbytes(c) for st in runner.states for c in st.clients.ids())
    for states in kept_per_client:  # optimizer.state: kept; model.buffers: local
        size += sum(states.nbytes(c) for c in states.ids())
    lock.check()  # never into a directory another run may have taken over
    checkpoint.save(out, checkpoint.capture(runner.snapshot(), wandb_run_id, client_states=False))
    where = f"{checkpoint.CHECKPOINT} rewritten without them"
    if store.exists():
        try:
            shutil.rmtree(store)
            where += f", {store}/ ({on_disk / 2**20:.1f} MiB on disk) deleted"
        except OSError as err:  # the outputs are complete: say what is left rather than fail the run
            where += f", but {store}/ could not be deleted ({err}); delete it by hand"
    return (f"cfl: keep_client_states: false: dropped {held} client states ({size / 2**20:.1f} MiB); {where}; "
            f"this run can no longer be resumed")
