"""Task schedules: which task each client trains on at each global round (``schedule:`` in the config).

A schedule is a client x round grid (:class:`Plan`): ``grid[c, r]`` is the task client ``c`` holds at global
round ``r`` (0-based), or -1 where it is not in the federation (not joined yet, or left). Each client goes through
its own order of tasks, switching at its own rounds; its last task lasts until the run ends (or it leaves). The
registered builders (:data:`SCHEDULES`, ``cfl list``) make the grid from the ``schedule`` section's keys that
they name as parameters (a key set for a builder that does not read it is refused, cfl/ignored_keys.py):

* ``synchronous`` (default): every client on the stream's task ``r // rounds_per_task``; ``join_per_task``
  clients join at each task after the first (GLFC's protocol, the old top-level ``clients_join_per_task``).
* ``staggered``: the stream's order (or ``order``), ``every`` rounds per task, each ``group`` of clients switching
  ``offset`` rounds after the previous group (Powder/C2Prompt: "2 clients switch to new tasks every 3 rounds").
* ``paced``: the last ``group`` clients ``offset`` rounds ahead of the others, switching that much early and
  staying on their last task to the end (Fed-CPrompt's asynchronous clients: half of them half a task ahead).
* ``per_client_order``: all switch together every ``every`` rounds, each client on its own order (a seeded
  permutation of the tasks, or a subset of ``tasks_per_client`` with ``overlap`` tasks shared by neighbours).
* ``random``: each client's time on each task drawn uniformly from ``every - spread .. every + spread`` (seeded).

Every non-synchronous builder also takes late joiners (``late_clients`` join at ``join_round``) and leavers
(``leave_clients`` leave at ``leave_round``). Everything is a pure function of the config and the stream's task
count, so the grid is built (and checked) when the config is validated, before any data, and again, identical,
by the engine and on resume. The checks of a plan and of the ``schedule`` keys against it and the methods are
cfl/schedule_checks.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cfl.config.keys import Config, ScheduleConfig
from cfl.config.schema import ConfigError
from cfl.registry import Registry

#: ``schedule.forgetting``: when a task counts as learned under a schedule (cfl/metrics/asynchronous.py)
FORGETTING = ("last_finisher", "first_finisher")

#: the derived seed stream of schedule draws (task orders, durations): apart from sampling's and partitions'
_SCHEDULE_SALT = 0x5C4ED


@dataclass(frozen=True)
class Timeline:
    """One client's plan: its tasks in order, the global round each starts at, and the round it leaves (None: it
    stays until the run's end)."""

    order: list[int]
    starts: list[int]
    leaves: int | None = None


@dataclass(frozen=True)
class Plan:
    """The client x round grid of a run (module docstring) and each client's timeline."""

    name: str
    timelines: list[Timeline]
    rounds: int  # global rounds of the run
    num_tasks: int

    def intervals(self) -> list[tuple[int, int, int, int]]:
        """``(client, task, first round, end round)`` of every stretch a client spends on a task (end exclusive,
        non-empty): the grid's rows without forming the grid, whose clients x rounds can be far too large."""
        out = []
        for c, line in enumerate(self.timelines):
            bound = self.rounds if line.leaves is None else min(line.leaves, self.rounds)
            ends = [*line.starts[1:], self.rounds]
            for task, start, end in zip(line.order, line.starts, ends, strict=True):
                if start < min(end, bound):
                    out.append((c, task, start, min(end, bound)))
        return out

    def clients_per_round(self) -> np.ndarray:
        """``(rounds,)``: how many clients hold a task at each round."""
        diff = np.zeros(self.rounds + 1, dtype=np.int64)
        for _, _, start, end in self.intervals():
            diff[start] += 1
            diff[end] -= 1
        return np.cumsum(diff[:-1])

    @property
    def grid(self) -> np.ndarray:
        """``(clients, rounds)`` int array: the task of each client at each round, -1 where it is absent."""
        grid = np.full((len(self.timelines), self.rounds), -1, dtype=np.int64)
        for c, line in enumerate(self.timelines):
            ends = [*line.starts[1:], self.rounds]
            for task, start, end in zip(line.order, line.starts, ends, strict=True):
                grid[c, start:min(end, self.rounds if line.leaves is None else line.leaves)] = task
        return grid

    @property
    def synchronous(self) -> bool:
        return self.name == "synchronous"

    def holders(self, task: int) -> list[int]:
        """The clients that hold ``task`` at some round (its data is split among them, in id order)."""
        return [c for c, line in enumerate(self.timelines) if task in self.held(c)]

    def held(self, client: int) -> list[int]:
        """The tasks ``client`` trains on at some round (its order, cut where it leaves)."""
        line = self.timelines[client]
        return [t for t, s in zip(line.order, line.starts, strict=True) if line.leaves is None or s < line.leaves]

    def switches(self) -> dict[int, list[tuple[int, int]]]:
        """Global round -> the (client, task) pairs of the clients that finish ``task`` after that round (switch to
        their next task). A client that leaves or is on its last task finishes nothing."""
        out: dict[int, list[tuple[int, int]]] = {}
        for c, line in enumerate(self.timelines):
            for i, start in enumerate(line.starts[1:]):
                if line.leaves is None or start < line.leaves:
                    out.setdefault(start - 1, []).append((c, line.order[i]))
        return out

    def first_finished(self) -> dict[int, int]:
        """Task -> the global round after which some client first finished it (switched away from it)."""
        out: dict[int, int] = {}
        for rnd, pairs in sorted(self.switches().items()):
            for _, task in pairs:
                out.setdefault(task, rnd)
        return out

    def last_left(self) -> dict[int, int]:
        """Task -> the global round after which its last holder switched away (the server-side task end); a task
        some client still holds at the run's end has none."""
        last: dict[int, int] = {}
        for _, task, _, end in self.intervals():
            last[task] = max(last.get(task, 0), end - 1)
        return {task: rnd for task, rnd in sorted(last.items()) if rnd < self.rounds - 1}

    def first_started(self) -> dict[int, int]:
        """Task -> the global round at which some client first trains on it."""
        out: dict[int, int] = {}
        for _, task, start, _ in self.intervals():
            out[task] = min(out.get(task, start), start)
        return dict(sorted(out.items()))

    def learned(self, forgetting: str = "last_finisher") -> dict[int, int]:
        """Task -> the global round after which it counts as learned (``schedule.forgetting``): its last holder left
        it (:meth:`last_left`, the server's task end) or some client first finished it (:meth:`first_finished`).
        A task with no such round (held to the run's end) is left out."""
        if forgetting == "first_finisher":
            return self.first_finished()
        if forgetting == "last_finisher":
            return self.last_left()
        raise ConfigError(f"'schedule.forgetting' must be one of {list(FORGETTING)}, got {forgetting!r}")

    def rounds_in_task(self, client: int, rnd: int) -> int:
        """Rounds ``client`` has spent on its current task before round ``rnd``."""
        starts = [s for s in self.timelines[client].starts if s <= rnd]
        return rnd - starts[-1]

    def task_start(self, client: int, rnd: int) -> int:
        """The global round at which ``client``'s task at round ``rnd`` began."""
        return rnd - self.rounds_in_task(client, rnd)

    def finishers(self, task: int) -> list[int]:
        """The clients that finish ``task`` (switch away from it to their next one), in id order."""
        return sorted(c for pairs in self.switches().values() for c, t in pairs if t == task)

    def seen(self, client: int, rnd: int) -> list[int]:
        """The tasks ``client`` has started by round ``rnd`` (its current one last)."""
        line = self.timelines[client]
        return [t for t, s in zip(line.order, line.starts, strict=True) if s <= rnd]

    def draw(self, rows: int = 12, columns: int = 40) -> str:
        """The grid as text: one line per client, one character per round (the task id, ``.`` when absent)."""
        grid = self.grid[:rows, :columns]
        lines = [f"client {c:>3} " + "".join("." if t < 0 else _digit(int(t)) for t in row)
                 for c, row in enumerate(grid)]
        more = [f"... ({len(self.timelines) - rows} more clients)"] if len(self.timelines) > rows else []
        return "\n".join(lines + more)


def _digit(task: int) -> str:
    return "0123456789abcdefghijklmnopqrstuvwxyz"[task] if task < 36 else "#"


@dataclass(frozen=True)
class ScheduleInput:
    """What a builder is built from besides the ``schedule`` section's keys."""

    num_clients: int
    num_tasks: int
    rounds_per_task: int
    seed: int  # the schedule's seed (schedule.seed, else the run seed)


def _rng(inp: ScheduleInput, *salt: int) -> np.random.Generator:
    return np.random.default_rng([inp.seed, _SCHEDULE_SALT, *salt])


def _orders(inp: ScheduleInput, order: str, tasks_per_client: int | None, overlap: int) -> list[list[int]]:
    """Each client's order of tasks: ``stream``, ``permuted`` (a seeded permutation per client) or ``subset``
    (``tasks_per_client`` consecutive tasks of a seeded permutation of the stream, client ``c`` starting
    ``tasks_per_client - overlap`` tasks after client ``c - 1``, so that neighbours share ``overlap`` tasks)."""
    tasks = list(range(inp.num_tasks))
    if order == "stream":
        return [tasks for _ in range(inp.num_clients)]
    if order == "permuted":
        return [[int(t) for t in _rng(inp, 1, c).permutation(inp.num_tasks)] for c in range(inp.num_clients)]
    k = tasks_per_client or inp.num_tasks
    if k > inp.num_tasks:
        raise ConfigError(f"'schedule.tasks_per_client: {k}' exceeds the stream's {inp.num_tasks} tasks; lower it")
    if overlap >= k:
        raise ConfigError(f"'schedule.overlap: {overlap}' must be below schedule.tasks_per_client ({k}): "
                          "neighbouring clients would hold the same tasks; lower it")
    base = [int(t) for t in _rng(inp, 2).permutation(inp.num_tasks)]
    shift = k - overlap
    return [[base[(c * shift + i) % inp.num_tasks] for i in range(k)] for c in range(inp.num_clients)]


def _timelines(orders: list[list[int]], durations: list[list[int]], starts: list[int],
               leaves: list[int | None]) -> tuple[list[Timeline], int]:
    """Timelines from each client's order, time per task and first round; the run lasts until the last client has
    spent its time on its last task."""
    lines = []
    for order, spent, first, leave in zip(orders, durations, starts, leaves, strict=True):
        begins = [first + int(sum(spent[:i])) for i in range(len(order))]
        lines.append(Timeline(order, begins, leave))
    rounds = max(s + int(sum(d)) for s, d in zip(starts, durations, strict=True))
    return lines, rounds


def _arrivals(inp: ScheduleInput, late_clients: int, join_round: int, leave_clients: int,
              leave_round: int) -> tuple[list[int], list[int | None]]:
    """First round and leaving round of each client: the last ``late_clients`` join at ``join_round``, the first
    ``leave_clients`` leave at ``leave_round``."""
    n = inp.num_clients
    if late_clients + leave_clients > n:
        raise ConfigError(f"'schedule.late_clients: {late_clients}' and 'schedule.leave_clients: {leave_clients}' "
                          f"together exceed num_clients ({n}); lower them")
    if late_clients and join_round == 0:
        raise ConfigError("'schedule.late_clients' is set but 'schedule.join_round' is 0: late clients join at a "
                          "later round; set schedule.join_round")
    if leave_clients and leave_round == 0:
        raise ConfigError("'schedule.leave_clients' is set but 'schedule.leave_round' is 0: a client must train "
                          "before it leaves; set schedule.leave_round")
    starts = [join_round if c >= n - late_clients else 0 for c in range(n)]
    leaves: list[int | None] = [leave_round if c < leave_clients else None for c in range(n)]
    return starts, leaves


def _every(every: int, inp: ScheduleInput) -> int:
    return every or inp.rounds_per_task


def synchronous(inp: ScheduleInput, join_per_task: int = 0) -> Plan:
    """Every client on the stream's task ``r // rounds_per_task``; ``join_per_task`` clients join at each task
    after the first (GLFC's protocol: ``num_clients`` is the total at the last task)."""
    first = inp.num_clients - join_per_task * (inp.num_tasks - 1)
    lines = []
    for c in range(inp.num_clients):
        joins = 0 if c < first else (c - first) // join_per_task + 1
        order = list(range(joins, inp.num_tasks))
        lines.append(Timeline(order, [t * inp.rounds_per_task for t in order]))
    return Plan("synchronous", lines, inp.num_tasks * inp.rounds_per_task, inp.num_tasks)


def staggered(inp: ScheduleInput, order: str = "auto", tasks_per_client: int | None = None, overlap: int = 0,
              every: int = 0, group: int = 1, offset: int = 1, late_clients: int = 0, join_round: int = 0,
              leave_clients: int = 0, leave_round: int = 0) -> Plan:
    """``every`` rounds per task; each ``group`` of clients switches ``offset`` rounds after the previous one (its
    first task lasts that much longer, its last one that much shorter than the last group's)."""
    if group > inp.num_clients:
        raise ConfigError(f"'schedule.group: {group}' is above num_clients ({inp.num_clients}): every client would "
                          "be in the first group and nothing is staggered; lower schedule.group below num_clients, "
                          "or use schedule.name: synchronous")
    k = _every(every, inp)
    orders = _orders(inp, "stream" if order == "auto" else order, tasks_per_client, overlap)
    starts, leaves = _arrivals(inp, late_clients, join_round, leave_clients, leave_round)
    delays = [(c // group) * offset for c in range(inp.num_clients)]
    durations = [[k + delays[c] if i == 0 else k for i in range(len(o))] for c, o in enumerate(orders)]
    lines, rounds = _timelines(orders, durations, starts, leaves)
    return Plan("staggered", lines, rounds, inp.num_tasks)


def paced(inp: ScheduleInput, order: str = "auto", tasks_per_client: int | None = None, overlap: int = 0,
          every: int = 0, group: int = 1, offset: int = 1, late_clients: int = 0, join_round: int = 0,
          leave_clients: int = 0, leave_round: int = 0) -> Plan:
    """The last ``group`` clients run ``offset`` rounds ahead of the others: they switch to each next task ``offset``
    rounds early and stay on their last task to the run's end, which is the others' (``tasks x every`` rounds
    without late joiners).
    Fed-CPrompt's asynchronous clients (Bagwe et al. 2023; github.com/grbagwe/Fed-CPrompt, commit a19c98b,
    ``trainer_pacing_clients.py``: clients 5-9 of 10 move to task ``t + 1`` at round ``num_rounds / 2`` of task ``t``,
    ``pacing`` 1, and stay on the last task to the end)."""
    k = _every(every, inp)
    if not 1 <= group < inp.num_clients:
        raise ConfigError(f"'schedule.group: {group}' must be below num_clients ({inp.num_clients}) for "
                          "schedule.name: paced: it is the number of clients running ahead, and with all of them "
                          "ahead nothing is paced; lower schedule.group (Fed-CPrompt's code: half the clients)")
    if not 1 <= offset < k:
        raise ConfigError(f"'schedule.offset: {offset}' must be from 1 to {k - 1} (below the {k} rounds a task, "
                          "schedule.every or rounds_per_task) for schedule.name: paced: the leading clients switch "
                          "that many rounds early, and a lead of a whole task would skip one; set it in that range "
                          f"(Fed-CPrompt's code: half a task, {k - k // 2})")
    orders = _orders(inp, "stream" if order == "auto" else order, tasks_per_client, overlap)
    starts, leaves = _arrivals(inp, late_clients, join_round, leave_clients, leave_round)
    first_leader = inp.num_clients - group

    def durations(c: int, tasks: int) -> list[int]:
        if c < first_leader or tasks == 1:
            return [k] * tasks
        return [k - offset] + [k] * (tasks - 2) + [k + offset]

    lines, rounds = _timelines(orders, [durations(c, len(o)) for c, o in enumerate(orders)], starts, leaves)
    return Plan("paced", lines, rounds, inp.num_tasks)


def per_client_order(inp: ScheduleInput, order: str = "auto", tasks_per_client: int | None = None,
                     overlap: int = 0, every: int = 0, late_clients: int = 0, join_round: int = 0,
                     leave_clients: int = 0, leave_round: int = 0) -> Plan:
    """All clients switch together every ``every`` rounds, each through its own order (``auto``: permuted)."""
    if order == "stream":
        raise ConfigError("'schedule.order: stream' with 'schedule.name: per_client_order' gives every client the "
                          "stream's order: that is schedule.name: synchronous; set schedule.order: permuted or subset")
    k = _every(every, inp)
    orders = _orders(inp, "permuted" if order == "auto" else order, tasks_per_client, overlap)
    starts, leaves = _arrivals(inp, late_clients, join_round, leave_clients, leave_round)
    lines, rounds = _timelines(orders, [[k] * len(o) for o in orders], starts, leaves)
    return Plan("per_client_order", lines, rounds, inp.num_tasks)


def random(inp: ScheduleInput, order: str = "auto", tasks_per_client: int | None = None, overlap: int = 0,
           every: int = 0, spread: int | None = None, late_clients: int = 0, join_round: int = 0,
           leave_clients: int = 0, leave_round: int = 0) -> Plan:
    """Each client's rounds on each task drawn uniformly from ``every - spread .. every + spread`` (at least 1;
    ``spread`` null: ``every // 2``), seeded by ``schedule.seed``; order ``auto``: the stream's."""
    k = _every(every, inp)
    s = k // 2 if spread is None else spread
    orders = _orders(inp, "stream" if order == "auto" else order, tasks_per_client, overlap)
    starts, leaves = _arrivals(inp, late_clients, join_round, leave_clients, leave_round)
    durations = [[int(d) for d in _rng(inp, 3, c).integers(max(1, k - s), k + s + 1, size=len(o))]
                 for c, o in enumerate(orders)]
    lines, rounds = _timelines(orders, durations, starts, leaves)
    return Plan("random", lines, rounds, inp.num_tasks)


SCHEDULES: Registry[Callable[..., Plan]] = Registry("schedule")
SCHEDULES.register("synchronous", synchronous, about="every client switches to the stream's next task at the same "
                   "round (join_per_task: GLFC's clients joining at task starts)")
SCHEDULES.register("staggered", staggered, about="groups of clients switch tasks at offset rounds (Powder/C2Prompt)")
SCHEDULES.register("paced", paced, about="the last group of clients runs offset rounds ahead of the others, "
                   "staying on its last task to the end (Fed-CPrompt's asynchronous clients)")
SCHEDULES.register("per_client_order", per_client_order, about="each client its own order of tasks (a seeded "
                   "permutation, or a subset with an overlap; FedWeIT's setting), switching together")
SCHEDULES.register("random", random, about="each client's time on each task drawn at random (FedSpace-like)")


def schedule_params(section: ScheduleConfig) -> dict[str, Any]:
    """The ``schedule`` section's keys that its builder names as parameters."""
    import inspect

    names = set(inspect.signature(SCHEDULES[section.name]).parameters) - {"inp"}
    return {k: getattr(section, k) for k in names if hasattr(section, k)}


def build_plan(cfg: Config, num_tasks: int) -> Plan:
    """The run's plan from its config (``cfg.schedule``, the old ``clients_join_per_task``) and task count."""
    section = cfg.schedule
    if section.name not in SCHEDULES:
        raise SCHEDULES.unknown(section.name, "schedule.name")
    params = schedule_params(section)
    if cfg.clients_join_per_task and section.name == "synchronous":
        params["join_per_task"] = cfg.clients_join_per_task  # the old key: GLFC's protocol
    seed = cfg.seed if section.seed is None else section.seed
    return SCHEDULES[section.name](ScheduleInput(cfg.num_clients, num_tasks, cfg.rounds_per_task, seed), **params)
