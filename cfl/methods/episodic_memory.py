"""A client's episodic memory of its own samples from earlier tasks, balanced over tasks and classes: what ER+FL
replays and what A-GEM and GEM take their reference gradients on (``cfl/methods/er.py``, ``agem.py``, ``gem.py``).

At each task end a client refills its fixed-size memory (``mem_per_client`` slots): the budget is split
equally over the tasks seen so far and, within a task, equally over the classes the client holds (a share
a task or class cannot fill goes to the others). Samples within a (task, class) group are a uniform
random subset of the client's data, which is what reservoir sampling yields; when a new task arrives
each old group keeps a prefix of its (already random) samples, so the memory stays balanced, bounded
and a uniform sample. Each sample keeps its task id, so task-incremental samples use their own head.
"""

from __future__ import annotations

import torch

from cfl.methods.base import ClientEndContext, Method, Payload, Samples, Sends
from cfl.tensors import State


def balanced_quota(total: int, caps: list[int]) -> list[int]:
    """Split ``total`` as equally as possible over groups holding at most ``caps[i]``; earlier groups get
    the remainder; a share a group cannot take goes to the others (water filling)."""
    quota = [0] * len(caps)
    left = total
    open_groups = [i for i, c in enumerate(caps) if c > 0]
    while left > 0 and open_groups:
        share, extra = divmod(left, len(open_groups))
        for rank, i in enumerate(open_groups):
            give = min(caps[i] - quota[i], share + (1 if rank < extra else 0))
            quota[i] += give
            left -= give
        open_groups = [i for i in open_groups if quota[i] < caps[i]]
    return quota


class EpisodicMemory(Method):
    """A method holding each client's episodic memory (``hparams.mem_per_client`` slots), refilled at task ends."""

    # memories come from local data only: nothing is downloaded
    sends = Sends(downloads_model_at_task_end=False, client_events=("task_end",))

    def count_bytes(self, ctx: Payload) -> int | None:
        """Every client keeps ``mem_per_client`` slots: an input, a label and a task id (int64), a valid flag."""
        return s.num_clients * self.hparams.mem_per_client * (s.sample_bytes + 8 + 8 + 1) if (s := ctx.sizing) else None

    def client_end(self, ctx: ClientEndContext) -> None:
        data, state, generator = ctx.data, ctx.state, ctx.generator
        groups = self._memory_groups(state)  # task -> class -> sample rows (x, y) in random order
        order = torch.randperm(len(data.y), generator=generator).to(data.y.device)
        x, y = data.x[order], data.y[order]
        groups[data.task] = {int(c): (x[y == c], y[y == c]) for c in torch.unique(y).tolist()}
        tasks = sorted(groups)
        sizes = [sum(len(g[1]) for g in groups[t].values()) for t in tasks]
        task_quota = balanced_quota(self.hparams.mem_per_client, sizes)
        xs, ys, ts = [], [], []
        for t, quota in zip(tasks, task_quota, strict=True):
            classes = sorted(groups[t])
            for c, q in zip(classes, balanced_quota(quota, [len(groups[t][c][1]) for c in classes]), strict=True):
                gx, gy = groups[t][c]
                xs.append(gx[:q])
                ys.append(gy[:q])
                ts.append(torch.full((q,), t, dtype=torch.long, device=gy.device))
        self._store(state, torch.cat(xs), torch.cat(ys), torch.cat(ts), data.x)

    def _memory_groups(self, state: State) -> dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
        groups: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        if "valid" not in state:
            return groups
        n = int(state["valid"].sum())
        x, y, task = state["x"][:n], state["y"][:n], state["task"][:n]
        for t in torch.unique(task).tolist():
            in_task = task == t
            groups[int(t)] = {int(c): (x[in_task & (y == c)], y[in_task & (y == c)])
                              for c in torch.unique(y[in_task]).tolist()}
        return groups

    def _store(self, state: State, x: torch.Tensor, y: torch.Tensor, task: torch.Tensor, like: torch.Tensor) -> None:
        """Write the memory into fixed-size slots (filled ones first) so every client's state has one shape."""
        size, n = self.hparams.mem_per_client, len(y)
        state["x"] = torch.zeros(size, *like.shape[1:], dtype=like.dtype, device=like.device)
        state["y"] = torch.zeros(size, dtype=torch.long, device=like.device)
        state["task"] = torch.zeros(size, dtype=torch.long, device=like.device)
        state["valid"] = torch.zeros(size, dtype=torch.bool, device=like.device)
        state["x"][:n], state["y"][:n], state["task"][:n], state["valid"][:n] = x, y, task, True

    def draw(self, state: State, generator: torch.Generator, size: int) -> Samples | None:
        """Up to ``size`` memory samples drawn without replacement from ``generator``; None before the first task
        end."""
        return draw_memory(state, generator, size)


def draw_memory(state: State, generator: torch.Generator, count: int) -> Samples | None:
    """``count`` samples drawn without replacement from a memory in fixed slots (``x``, ``y``, ``task``, ``valid``,
    filled ones first; None before it holds any), by the client's ``generator``."""
    if "valid" not in state:
        return None
    n = int(state["valid"].sum())
    pick = torch.randperm(n, generator=generator)[:count].to(state["x"].device)
    return Samples(state["x"][pick], state["y"][pick], state["task"][pick])
