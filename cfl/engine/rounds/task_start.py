"""The ``"task_start"`` broadcast (``Method.sends.broadcast``): server-state keys a client downloads once per task, at
its first sampled round of the task, and keeps for the task's later rounds.

The engine hands the keys to the hooks of every round of the task with the round's keys (the client's kept
copy); their bytes count once per client and task, when the client is first sampled in the task. Which
clients were sampled before is derived from the schedule (a pure function of the seed), so a resumed run
counts exactly as an uninterrupted one. A kept copy is only what the server holds if the server does not
change the keys during the task: a key replaced or written in place after the task's first round sent it is
refused (the method should change it at a task end: ``server_event`` at "before_task_end" or "task_end").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cfl.engine.hook_call import refuse
from cfl.methods.base import Method
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


def unchanged_payload(method: Method, server: State, prints: dict[int, Any], i: int, changed_when: str) -> State:
    """Method ``i``'s ``"task_start"`` keys (those the server holds), refused (naming ``changed_when``) where they
    differ from what ``prints`` recorded when they were last sent; ``prints`` then holds them."""
    payload = {k: server[k] for k in method.sends.broadcast.get("task_start", ()) if k in server}
    if not method.sends.broadcast.get("task_start"):
        return payload
    now = _fingerprint(payload, "")
    changed = _changed(prints.setdefault(i, now), now)
    if changed:
        refuse(method, "broadcast", f"the server-state key(s) {', '.join(p.lstrip('.') for p in changed)} listed under "
               f"broadcast['task_start'] {changed_when}; change these keys only at a task end "
               "(server_event at 'before_task_end' or 'task_end'), or list them under 'round'")
    prints[i] = now
    return payload


class TaskStarts:
    """Under the run's plan (cfl/schedules.py), per method: a sampled client gets the
    ``"task_start"`` keys at its first sampled round of each of its own tasks, and again at its next sampled round
    after the server changed them (at a task end: a client's switch or a task's last holder leaving, the only
    moments they may change), so that its hooks always read what it was sent; each sending is counted. The
    rounds at which each method's keys changed are kept in ``changes`` (the run's progress, checkpointed), so a
    resumed run counts exactly as an uninterrupted one."""

    def __init__(self, methods: list[Method], sampled: Callable[[int], list[int]], starts: Callable[[int, int], int],
                 changes: Callable[[], dict[str, list[int]]]) -> None:
        """``sampled(round)``: the clients of a round; ``starts(client, round)``: the round its task at ``round``
        began; ``changes()``: method index (str) -> the first rounds after each change of its keys (in the run's
        progress)."""
        self.methods, self.sampled, self.starts, self._changes = methods, sampled, starts, changes
        self.active = any(m.sends.broadcast.get("task_start") for m in methods)
        self._next_round = -1
        self._sent: list[dict[int, int]] = [{} for _ in methods]  # per method: client -> round it was last sent
        self._prints: dict[int, list[tuple[str, Any, Any]]] = {}

    def _replay(self, rnd: int) -> None:
        """The rounds each client was last sent the keys, from the schedule's sampling (a new or resumed run)."""
        self._sent = [{} for _ in self.methods]
        for r in range(rnd):
            self._send(r, self.sampled(r))

    def _send(self, rnd: int, cids: list[int]) -> list[list[int]]:
        out = []
        for i, sent in enumerate(self._sent):
            if not self.methods[i].sends.broadcast.get("task_start"):
                out.append([])
                continue
            changed = max((r for r in self._changes().get(str(i), []) if r <= rnd), default=0)
            new = [c for c in cids if sent.get(c, -1) < max(self.starts(c, rnd), changed)]
            sent.update({c: rnd for c in new})
            out.append(new)
        return out

    def newcomers(self, task: int, rnd: int, cids: list[int]) -> list[list[int]]:
        """Per method, the clients of ``cids`` (global round ``rnd``) that get its keys in this round."""
        if not self.active:
            return [[] for _ in self.methods]
        if rnd != self._next_round:
            self._replay(rnd)
        self._next_round = rnd + 1
        return self._send(rnd, cids)

    def before_task_ends(self, servers: list[State]) -> None:
        """The keys as they are before a round's task ends (refused if the round changed them)."""
        for i, server in enumerate(servers):
            self.payload(i, server)

    def after_task_ends(self, rnd: int, servers: list[State]) -> None:
        """Record the methods whose keys the task ends after round ``rnd`` (0-based) changed: they are sent again."""
        for i, server in enumerate(servers):
            now = _fingerprint(self._keys(i, server), "")
            if i in self._prints and _changed(self._prints[i], now):
                self._changes().setdefault(str(i), []).append(rnd + 1)
            self._prints[i] = now

    def _keys(self, i: int, server: State) -> State:
        return {k: server[k] for k in self.methods[i].sends.broadcast.get("task_start", ()) if k in server}

    def payload(self, i: int, server: State) -> State:
        """Method ``i``'s ``"task_start"`` keys, refused if a round (not a task end) changed them."""
        return unchanged_payload(self.methods[i], server, self._prints, i,
                                 "changed in a round, after a round sent them: the clients are sent them at their "
                                 "task starts and again after each task end that changed them")
