"""Partitioners: split one task's training set over clients, each task on its own, seeded.

Every partitioner returns ``num_clients`` index arrays into the task's training tensors; clients never
share a sample (except ``classes`` with ``overlap``, GLFC's protocol, by design) and (except for the label-skew
ones, by design) hold similar amounts of data.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cfl.config.schema import ConfigError
from cfl.registry import Registry


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, **_: float) -> list[np.ndarray]:
    """Shuffle the task's training set and cut it into equal chunks (FOT reference IID)."""
    return [np.sort(c) for c in np.array_split(rng.permutation(len(labels)), num_clients)]


def shards(labels: np.ndarray, num_clients: int, rng: np.random.Generator, shards_per_client: int = 2,
           **_: float) -> list[np.ndarray]:
    """Sort by label, cut into ``shards_per_client * num_clients`` equal shards, deal them at random.

    The FOT reference non-IID split (2 shards per client) and McMahan et al.'s pathological split.
    """
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, shards_per_client * num_clients)
    deal = rng.permutation(len(pieces)).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]


def dirichlet(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float = 0.5,
              min_samples: int = 1, **_: float) -> list[np.ndarray]:
    """Label skew: each class is split over clients with proportions ~ Dir(alpha) (Hsu et al. 2019).

    Redrawn (up to 1000 times) until every client holds at least ``min_samples`` samples. A draw only
    counts each client's samples (no per-client arrays), so a refused setting costs seconds even at
    10,000 clients; the index arrays are built once, for the draw that is kept.
    """
    classes = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _attempt in range(1000):
        owners, held = [], np.zeros(num_clients, dtype=np.int64)
        for members in classes:
            idx = rng.permutation(members)
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha))) * len(idx)).astype(int)[:-1]
            sizes = np.diff(np.concatenate([[0], np.clip(cuts, 0, len(idx)), [len(idx)]]))
            held += sizes
            owners.append((idx, sizes))
        if held.min() >= min_samples:
            owner = np.empty(len(labels), dtype=np.int64)
            for idx, sizes in owners:
                owner[idx] = np.repeat(np.arange(num_clients), sizes)
            order = np.argsort(owner, kind="stable")  # by client, then by row: each part sorted
            return np.split(order, np.cumsum(held)[:-1])
    raise ConfigError(f"partition 'dirichlet' with alpha={alpha}: none of 1000 draws gave every one of "
                      f"{num_clients} clients {min_samples} sample(s) out of {len(labels)} "
                      f"({len(labels) / num_clients:.1f} per client on average); raise partition.alpha, "
                      f"lower num_clients or partition.min_samples, or use partition.name: quantity "
                      f"(sizes skewed, every client guaranteed min_samples)")


def quantity(labels: np.ndarray, num_clients: int, rng: np.random.Generator, beta: float = 0.5,
             min_samples: int = 1, **_: float) -> list[np.ndarray]:
    """Quantity skew: client sizes ~ Dir(beta) proportions, labels IID (Li et al. 2022, NIID-Bench)."""
    n = len(labels)
    if n < num_clients * min_samples:
        raise ConfigError(f"partition 'quantity': {n} samples cannot give {num_clients} clients "
                          f"{min_samples} each; lower num_clients")
    spare = n - num_clients * min_samples
    sizes = np.floor(rng.dirichlet(np.full(num_clients, beta)) * spare).astype(int) + min_samples
    sizes[: n - sizes.sum()] += 1  # hand out the rounding remainder
    cuts = np.cumsum(sizes)[:-1]
    return [np.sort(p) for p in np.split(rng.permutation(n), cuts)]


def classes(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, classes_per_client: int,
            overlap: bool, **_: float) -> list[np.ndarray]:
    """Each client draws ``classes_per_client`` of the task's classes at random (GLFC's protocol, Dong et al. 2022;
    official code: 6 of a task's 10). ``overlap``: it holds every training sample of them, so clients drawing a
    class share its samples (the official code); else each class's samples are shuffled and cut into equal
    chunks, one per client that drew it (a class nobody drew is left out in both)."""
    present = np.unique(labels)
    if classes_per_client > len(present):
        raise ConfigError(f"partition 'classes': partition.classes_per_client={classes_per_client}, but a task has "
                          f"only {len(present)} classes; lower partition.classes_per_client")
    picks = [rng.choice(present, size=classes_per_client, replace=False) for _ in range(num_clients)]
    if overlap:
        return [np.flatnonzero(np.isin(labels, p)) for p in picks]
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in present:
        holders = [i for i, p in enumerate(picks) if c in p]
        rows = rng.permutation(np.flatnonzero(labels == c))
        if len(rows) < len(holders):
            raise ConfigError(f"partition 'classes' without overlap: class {c} has {len(rows)} training samples "
                              f"for the {len(holders)} clients that drew it, so some would miss it; set "
                              "partition.overlap: true, or lower num_clients or partition.classes_per_client")
        for cid, chunk in zip(holders, np.array_split(rows, max(len(holders), 1)), strict=False):
            pieces[cid].append(chunk)
    return [np.sort(np.concatenate(p)) for p in pieces]


#: ``partition.name`` -> split of one task's labels: ``(labels, num_clients, rng, **params) -> index arrays``
PARTITIONERS: Registry[Callable[..., list[np.ndarray]]] = Registry("partitioner")
PARTITIONERS.register("iid", iid, about="shuffle and cut into equal chunks")
PARTITIONERS.register("shards", shards, about="sort by label, 2 (shards_per_client) random label shards per client")
PARTITIONERS.register("dirichlet", dirichlet, about="label skew, class proportions ~ Dir(alpha) per client")
PARTITIONERS.register("quantity", quantity, about="quantity skew, client sizes ~ Dir(beta), labels IID")
PARTITIONERS.register("classes", classes, about="GLFC's protocol: each client draws classes_per_client of the task's "
                      "classes, all their samples (overlap) or an equal share")


def check_sizes(name: str, task_sizes: dict[int, int], num_clients: int, shards_per_client: int = 2,
                **_: float) -> None:
    """Refuse, before any round, a split that would leave a client without data (``task_sizes``: training
    samples per task): fewer samples than clients, or for ``shards`` fewer than ``shards_per_client * num_clients``
    (empty shards). The Dirichlet split is random and checked when drawn (the run's schedule draws every
    task's split before the first round)."""
    for task, n in task_sizes.items():
        if n < num_clients:
            raise ConfigError(f"task {task} has {n} training samples, fewer than num_clients={num_clients}; "
                              "lower num_clients")
        if name == "shards" and n < shards_per_client * num_clients:
            raise ConfigError(f"partition 'shards': task {task} has {n} training samples, fewer than the "
                              f"{shards_per_client * num_clients} shards of partition.shards_per_client="
                              f"{shards_per_client} x num_clients={num_clients}, so some clients would get no data; "
                              "lower partition.shards_per_client or num_clients")


def partition(name: str, labels: np.ndarray, num_clients: int, seed: int, task: int,
              **params: float) -> list[np.ndarray]:
    """Split one task's labels over ``num_clients``; the result depends only on (seed, task)."""
    rng = np.random.default_rng([seed, task, 0x9A27])
    check_sizes(name, {task: len(labels)}, num_clients, **params)
    return PARTITIONERS[name](labels, num_clients, rng, **params)
