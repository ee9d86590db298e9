"""Many clients: peak memory, seconds per round and checkpoint time against num_clients (docs/scaling.md).

The Permuted-MNIST reference setup (MLP 784-400-400-400-10, batch 64, lr 0.01) on Permuted Fashion-MNIST
(``configs/permuted-fmnist.yaml``), 20 sampled clients a round, for each method and ``num_clients``. Each
setting is a fresh process running ``cfl run`` in-process (``cfl.app.single_run.execute``, W&B off, quiet) with
timers around the round, the task end and the checkpoint writer; it prints one JSON line:

- ``peak_rss_mb``: the process's peak resident memory (``ru_maxrss``), data and model included;
- ``sec_per_round``: median wall time of ``Runner.run_round``; ``task_end_sec``: the client task-end hooks;
- ``store_sec_per_round``: time in the client-state store's ``get``/``put`` inside rounds (mean per round),
  the part of a round that the store adds, measurable on a machine whose load varies;
- ``checkpoint_sec``: the checkpoints written at task ends (max), ``checkpoint_mb``: ``checkpoint.pt``'s size;
- ``store``: where the client states lived, ``client_states_mb``: the disk store's files at the end;
- ``refused``: the refusal's message where the run was refused before it started (the disk cannot hold it).

    python benchmarks/scale.py [--methods fedavg,fot,ewc,er,gpm,fedcurv] [--clients 125,1000,10000]
                               [--tasks 2] [--rounds 2] [--out /tmp/cfl-scale] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "permuted-fmnist.yaml"


def timed(owner: Any, name: str, into: list[float]) -> None:
    """Wrap ``owner.name`` so every call's wall time is appended to ``into``."""
    real = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    setattr(owner, name, wrapper)


def one(method: str, clients: int, tasks: int, rounds: int, out: Path, sets: list[str]) -> dict[str, Any]:
    from cfl.app import single_run
    from cfl.config.schema import ConfigError
    from cfl.engine.rounds.runner import Runner
    from cfl.engine.stores.disk_states import DiskClientStates
    from cfl.records.client_states import ClientStates
    from cfl.validation import load_config

    overrides = [f"method.name={method}", f"num_clients={clients}", "clients_per_round=20",
                 f"stream.num_tasks={tasks}", f"rounds_per_task={rounds}", "checkpoint_every=0",
                 "wandb.mode=disabled", *sets]
    row: dict[str, Any] = {"method": method, "num_clients": clients, "tasks": tasks, "rounds_per_task": rounds}
    rounds_s: list[float] = []
    task_end_s: list[float] = []
    saves: list[float] = []
    store_s: list[float] = []
    for store in (ClientStates, DiskClientStates):
        timed(store, "get", store_s)
        timed(store, "put", store_s)
    in_rounds: list[float] = []
    real_round = Runner.run_round

    def run_round(self: Runner, task: int, rnd: int) -> dict[str, Any]:
        before = len(store_s)
        out = real_round(self, task, rnd)
        in_rounds.append(sum(store_s[before:]))
        return out

    Runner.run_round = run_round  # type: ignore[method-assign]
    timed(Runner, "run_round", rounds_s)
    timed(Runner, "task_end", task_end_s)
    timed(single_run.Checkpointer, "save", saves)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    try:
        cfg = load_config(CONFIG, overrides)
        results = single_run.execute(cfg, out, overwrite=True, quiet=True)
    except ConfigError as err:
        return {**row, "refused": str(err), "peak_rss_mb": round(peak_mb())}
    store = out / "client_states"
    row.update({
        "acc": round(results["acc"], 2),
        "peak_rss_mb": round(peak_mb()),
        "sec_per_round": round(statistics.median(rounds_s), 3),
        "store_sec_per_round": round(sum(in_rounds) / len(in_rounds), 4),
        "task_end_sec": round(sum(task_end_s), 2),
        # saves: round 0, then one per task end (checkpoint_every=0); the last one follows the final task
        "checkpoint_sec": round(max(saves[1:]), 3) if len(saves) > 1 else None,
        "checkpoint_mb": round((out / "checkpoint.pt").stat().st_size / 1e6, 2),
        "store": cfg.client_state_store if cfg.client_state_store != "auto" else
        ("disk" if store.is_dir() else "memory"),
        "client_states_mb": round(sum(p.stat().st_size for p in store.rglob("seg-*.log")) / 1e6, 1),
        "wall_sec": round(time.perf_counter() - start, 1),
    })
    shutil.rmtree(out, ignore_errors=True)
    return row


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="fedavg,fot,ewc,er,gpm,fedcurv")
    parser.add_argument("--clients", default="125,1000,10000")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/cfl-scale"))
    parser.add_argument("--set", action="append", default=[], dest="sets", help="extra config override")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, clients = args.one
        print(json.dumps(one(method, int(clients), args.tasks, args.rounds, args.out / f"{method}-{clients}",
                             args.sets)), flush=True)
        return
    for clients in args.clients.split(","):
        for method in args.methods.split(","):  # one process per setting: peak RSS is per setting
            cmd = [sys.executable, __file__, "--one", method, clients, "--tasks", str(args.tasks), "--rounds",
                   str(args.rounds), "--out", str(args.out)]
            for s in args.sets:
                cmd += ["--set", s]
            subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
