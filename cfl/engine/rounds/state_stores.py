"""The run's client-state stores, one per method: in memory or on disk, as ``client_state_store`` and the
methods' estimates decide (:mod:`cfl.engine.stores.state_budget`, docs/scaling.md).

On disk, method ``i`` keeps its clients under ``state_dir/<i>-<name>/``: the run directory's
``client_states/`` for ``cfl run``, a temporary directory (deleted with the runner) for a runner built
without one.
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import torch
from torch import nn

from cfl.config.keys import Config
from cfl.data.stream import Stream
from cfl.engine.rounds.server_state import counted
from cfl.engine.stores import state_budget
from cfl.engine.stores.disk_states import DiskClientStates
from cfl.engine.stores.state_budget import StateSizing
from cfl.methods.base import overrides, per_client_hooks
from cfl.methods.traffic_hooks import Payload
from cfl.records.client_states import ClientStates

if TYPE_CHECKING:
    from cfl.methods.base import Method

Store = Union[ClientStates, DiskClientStates]


def sizing_of(cfg: Config, stream: Stream, model: nn.Module, protected: dict[str, str]) -> StateSizing:
    """What the methods' estimates depend on, from the config, the stream and the model."""
    params = dict(model.named_parameters())
    first = stream.tasks[0].train_x
    widths = {name: (kind, math.prod(params[name].shape[1:])) for name, kind in protected.items()}
    return StateSizing(
        model_bytes=sum(p.numel() * p.element_size() for p in params.values()),
        sample_bytes=math.prod(first.shape[1:]) * first.element_size(),
        samples_per_client=sum(len(t.train_y) for t in stream.tasks) / len(stream.tasks) / cfg.num_clients,
        num_clients=cfg.num_clients, num_tasks=stream.num_tasks, rounds=stream.num_tasks * cfg.rounds_per_task,
        clients_per_round=cfg.clients_per_round, protected=widths, num_classes=stream.classes_per_head)


@dataclass
class ClientStores:
    """The stores of a run's methods and how they were chosen."""

    kind: str  # memory or disk
    estimates: list[int | None]  # each method's estimated bytes of all its clients' state
    stores: list[Store]
    root: Path | None = None  # where the disk store's files are

    def close(self) -> None:
        for store in self.stores:
            if isinstance(store, DiskClientStates):
                store.close()


def _estimate(method: Method, sizing: StateSizing) -> int | None:
    """``method``'s ``count_bytes("client_state")``; its default (None): no client state (0) where the method
    overrides neither ``client_end`` nor a hook of parameters kept per client, else no estimate (None)."""
    estimate = counted(method, Payload("client_state", sizing=sizing))
    if estimate is None and not (overrides(method, "client_end") or per_client_hooks(type(method))):
        return 0
    return estimate


def build_stores(cfg: Config, sizing: StateSizing, methods: list[Method], state_dir: Path | None,
                 device: torch.device) -> ClientStores:
    """One store per method; refuses (``ConfigError``) a disk store the file system cannot hold, and says on
    stderr when ``auto`` chose the disk or could not estimate a method's state."""
    estimates = [_estimate(m, sizing) for m in methods]
    total = sum(e or 0 for e in estimates)
    kind = state_budget.choose_store(cfg.client_state_store, total)
    if cfg.client_state_store == "auto":
        for m, e in zip(methods, estimates, strict=True):
            if e is None:
                print(f"cfl: method '{m.name}' gives no estimate of its client state (Method.count_bytes, "
                      "'client_state'); it is left out of the choice of the store (client_state_store: disk puts "
                      "every client state on disk)", file=sys.stderr)
    if kind == "memory":
        return ClientStores(kind, estimates, [ClientStates() for _ in methods])
    temporary = state_dir is None
    root = Path(tempfile.mkdtemp(prefix="cfl-client-states-")) if temporary else Path(state_dir)
    try:
        state_budget.check_disk(root, {m.name: e or 0 for m, e in zip(methods, estimates, strict=True)}, sizing)
    except BaseException:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
        raise
    if cfg.client_state_store == "auto":
        print(f"cfl: client states on disk in {root} (estimated {total / 1e9:.2f} GB for {cfg.num_clients} clients, "
              f"over the {state_budget.MEMORY_BYTES / 2**20:.0f} MiB kept in memory; client_state_store: memory "
              "keeps them there)", file=sys.stderr)
    stores: list[Store] = [DiskClientStates(root / f"{i}-{m.name}", device, cache_clients=cfg.clients_per_round)
                           for i, m in enumerate(methods)]
    out = ClientStores(kind, estimates, stores, root)
    if temporary:
        weakref.finalize(out, shutil.rmtree, str(root), True)
    return out
