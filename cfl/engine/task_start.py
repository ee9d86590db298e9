"""The ``"task_start"`` broadcast (``Method.broadcast``): server-state keys a client downloads once per task, at
its first sampled round of the task, and keeps for the task's later rounds.

The engine hands the keys to the hooks of every round of the task with the round's keys (the client's kept
copy); their bytes count once per client and task, when the client is first sampled in the task. Which
clients were sampled before is derived from the schedule (a pure function of the seed), so a resumed run
counts exactly as an uninterrupted one. A kept copy is only what the server holds if the server does not
change the keys during the task: a key replaced or written in place after the task's first round sent it is
refused (the method should change it at a task end: ``before_task_end`` or ``server_end("task_end")``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cfl.methods.base import Method
from cfl.methods.hook_guard import BrokenRule, guarded
from cfl.tensors import State


def _fingerprint(value: Any, path: str) -> list[tuple[str, Any, Any]]:
    """(path, leaf, version) of every leaf: a tensor by identity and in-place version, anything else by value."""
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _fingerprint(v, f"{path}.{k}")]
    if isinstance(value, list | tuple):
        return [f for i, v in enumerate(value) for f in _fingerprint(v, f"{path}[{i}]")]
    if isinstance(value, torch.Tensor):
        return [(path, value, value._version)]
    return [(path, None, value)]


def _changed(before: list[tuple[str, Any, Any]], now: list[tuple[str, Any, Any]]) -> list[str]:
    if [p for p, _, _ in before] != [p for p, _, _ in now]:
        return sorted({p for p, _, _ in before} ^ {p for p, _, _ in now}) or [p for p, _, _ in now]
    return [p for (p, a, u), (_, b, v) in zip(before, now, strict=True) if a is not b or u != v]


class TaskStarts:
    """Per round: which sampled clients get the ``"task_start"`` keys (those sampled for the first time in the
    task), and each method's keys, checked unchanged since the task's first round sent them."""

    def __init__(self, methods: list[Method], sampled: Callable[[int, int], list[int]]) -> None:
        """``sampled(task, round)``: the clients of that round (:meth:`cfl.engine.schedule.Schedule.sampled`)."""
        self.methods, self.sampled = methods, sampled
        self.active = any(m.broadcast.get("task_start") for m in methods)
        self._task, self._next_round = -1, 0
        self._seen: set[int] = set()
        self._prints: dict[int, list[tuple[str, Any, Any]]] = {}

    def newcomers(self, task: int, rnd: int, cids: list[int]) -> list[int]:
        """The clients of ``cids`` (round ``rnd`` of ``task``) not sampled in an earlier round of the task."""
        if not self.active:
            return []
        if (task, rnd) != (self._task, self._next_round):  # a new task, or a resumed run: from the schedule
            self._task, self._prints = task, {}
            self._seen = {c for r in range(rnd) for c in self.sampled(task, r)}
        new = [c for c in cids if c not in self._seen]
        self._seen.update(cids)
        self._next_round = rnd + 1
        return new

    def payload(self, i: int, server: State) -> State:
        """Method ``i``'s ``"task_start"`` keys (those the server holds), refused if changed during the task."""
        method = self.methods[i]
        keys = method.broadcast.get("task_start", ())
        payload = {k: server[k] for k in keys if k in server}
        if not keys:
            return payload
        now = _fingerprint(payload, "")
        before = self._prints.setdefault(i, now)
        changed = _changed(before, now)
        if changed:
            with guarded(method, "broadcast"):
                raise BrokenRule(
                    f"the server-state key(s) {', '.join(p.lstrip('.') for p in changed)} listed under "
                    f"broadcast['task_start'] changed during task {self._task} (0-based), after the task's first "
                    "round sent them: the clients keep what they downloaded first; change these keys only at a "
                    "task end (before_task_end, server_end('task_end')), or list them under 'round'")
        return payload
