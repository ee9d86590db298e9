"""Per-client task boundaries under a schedule (cfl/engine/rounds/task_end.py, cfl/engine/rounds/task_start.py): the
``"task_start"`` keys sent at each client's own task starts (and again after a task end changed them), counted
per sending; task-end uploads held until the task's last holder has left it (``server_task_end: last_holder``);
a method's own task-end draw among the clients that finish the task."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cfl.engine.rounds.round_draws import sample_clients
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint
from cfl.methods import METHODS
from cfl.methods.base import Method, Sends
from cfl.methods.hook_guard import HookError
from cfl.validation import from_dict
from tests.conftest import make_stream

POOL = torch.zeros(10)  # 40 bytes of float32
#: 4 clients, 2 tasks, every client sampled in every round; clients 0-1 switch after round 2, 2-3 after round 3
#: (1-based): the grid [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
STAGGERED = {"name": "staggered", "group": 2, "offset": 1, "every": 2}


class Pool(Method):
    """A pool from the start, replaced when a task's last holder has left it; records what each client's hooks see."""

    name = "pool-staggered"
    sends = Sends(server_events=("start", "before_task_end"), broadcast={"task_start": ("pool",)},
                  client_events=("round",))

    def __init__(self, hparams, run_info) -> None:
        super().__init__(hparams, run_info)
        self.seen: list[float] = []  # the pool's value each kept client's hooks saw, round after round


    def server_event(self, ctx):
        ctx.server["pool"] = POOL.clone() if ctx.event == "start" else POOL + ctx.task + 1

    def client_end(self, ctx):
        server = ctx.server
        self.seen.append(float(server["pool"][0]))


class PoolChangedInARound(Pool):
    name = "pool-round-change"

    sends = dataclasses.replace(Pool.sends, server_events=("start", "round", "before_task_end"))

    def server_event(self, ctx):
        if ctx.event != "round":
            return super().server_event(ctx)
        ctx.server["pool"] = ctx.server["pool"] + 1
        return None


def _config(name: str, per_round: int = 4, **kw: object):
    return from_dict({"num_clients": 4, "clients_per_round": per_round, "rounds_per_task": 2, "batch_size": 8,
                      "lr": 0.1, "method": {"name": name, **kw}, "schedule": STAGGERED,
                      "wandb": {"mode": "disabled"}})


def _stream():
    return make_stream("task", num_tasks=2, n_train=32, n_test=6)


def test_task_start_keys_go_to_each_client_at_its_own_task_starts_and_after_a_change():
    """Round 1: the 4 clients start task 0 (4 x 40 bytes); round 3: clients 0-1 start task 1 (2 x 40); after round
    3 task 0's last holders leave it and the pool changes: round 4 sends it to clients 0-1 again and to clients
    2-3 starting task 1 (4 x 40); round 5 sends nothing. 10 x 40 = 400 bytes."""
    with METHODS.temporarily("pool-staggered", Pool):
        runner = Runner(_config("pool-staggered"), _stream())
        assert runner.plan.grid.tolist() == [[0, 0, 1, 1, 1]] * 2 + [[0, 0, 0, 1, 1]] * 2
        runner.run()
    assert runner.comm.lines["task_start.pool-staggered"] == 10 * 40
    assert runner.progress.task_start_changes == {"0": [3]}
    # rounds 1-3: the first pool; rounds 4-5: task 0's end's, for every client
    assert runner.methods[0].seen == [0.0] * 12 + [1.0] * 8


def test_a_resumed_scheduled_run_counts_task_start_keys_as_an_uninterrupted_one(tmp_path):
    from tests.engine.test_checkpoint import run_to_end

    with METHODS.temporarily("pool-staggered", Pool):
        whole = run_to_end(_config("pool-staggered", per_round=2), _stream())
        half = run_to_end(_config("pool-staggered", per_round=2), _stream(), stop_after=3)
        checkpoint.save(tmp_path, checkpoint.capture(half.snapshot(), None))
        resumed = run_to_end(_config("pool-staggered", per_round=2), _stream(), payload=checkpoint.load(tmp_path))
    assert resumed.comm.lines["task_start.pool-staggered"] == whole.comm.lines["task_start.pool-staggered"] > 0
    assert resumed.progress.task_start_changes == whole.progress.task_start_changes == {"0": [3]}


def test_a_task_start_key_changed_in_a_round_is_refused_under_a_schedule():
    with METHODS.temporarily("pool-round-change", PoolChangedInARound):
        runner = Runner(_config("pool-round-change"), _stream())
        with pytest.raises(HookError, match=r"pool listed under broadcast\['task_start'\] changed in a round"):
            runner.run()


class Held(Method):
    """Uploads its client id at each client's task end; records the server's task ends."""

    name = "held-probe"
    sends = Sends(server_events=("task_end",), client_events=("task_end",), server_task_end="last_holder")

    def __init__(self, hparams, run_info) -> None:
        super().__init__(hparams, run_info)
        self.calls: list[tuple[str, int, list]] = []

    def client_end(self, ctx):
        data = ctx.data
        self.calls.append(("client", data.task, [data.x[0].clone()]))  # the client: by its first sample
        return {"n": torch.tensor(1.0)}


    def server_event(self, ctx):
        self.calls.append(("server", ctx.task, sorted(ctx.uploads)))


class Switch(Held):
    name = "switch-probe"
    sends = dataclasses.replace(Held.sends, server_task_end="switch")


class Drawn(Held):
    name = "drawn-probe"

    def __init__(self, hparams, run_info) -> None:
        super().__init__(hparams, run_info)
        self.task_end_clients = 1


def _ends(cls: type[Held]) -> list[tuple[str, int, list[int]]]:
    with METHODS.temporarily(cls.name, cls):
        runner = Runner(_config(cls.name), _stream())
        runner.run()
    x = runner.stream.tasks[0].train_x
    first = {c: x[runner.schedule.client_indices(0)[c][0]] for c in runner.plan.holders(0)}

    def client(sample: torch.Tensor) -> int:
        return next(c for c, f in first.items() if torch.equal(f, sample))

    return [(kind, task, [client(c) for c in cids] if kind == "client" else cids)
            for kind, task, cids in runner.methods[0].calls]


def test_task_end_uploads_are_held_until_the_tasks_last_holder_has_left_it():
    """Clients 0-1 end task 0 after round 2, clients 2-3 after round 3: one server task end, with all four."""
    assert _ends(Held) == [("client", 0, [0]), ("client", 0, [1]), ("client", 0, [2]), ("client", 0, [3]),
                           ("server", 0, [0, 1, 2, 3])]
    assert _ends(Switch) == [("client", 0, [0]), ("client", 0, [1]), ("server", 0, [0, 1]),
                             ("client", 0, [2]), ("client", 0, [3]), ("server", 0, [2, 3])]


def test_a_methods_own_task_end_draw_is_among_the_clients_that_finish_the_task():
    drawn = [0, 1, 2, 3][sample_clients(_config("fedavg").seed, 0, 2**32, 4, 1)[0]]
    assert _ends(Drawn) == [("client", 0, [drawn]), ("server", 0, [drawn])]
