"""Schedules (cfl/schedules.py): the client x round grids, their refusals, and the metrics under them."""

from __future__ import annotations

import numpy as np
import pytest

from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.methods.base import Requires
from cfl.metrics.asynchronous import scheduled_metrics
from cfl.metrics.matrix import backward_transfer, forgetting
from cfl.metrics.results import build_results
from cfl.schedules import SCHEDULES, ScheduleInput, build_plan, paced, per_client_order, staggered
from tests.conftest import make_stream, tiny_config


def test_staggered_groups_switch_offset_rounds_apart():
    plan = staggered(ScheduleInput(num_clients=4, num_tasks=2, rounds_per_task=2, seed=0), group=2, offset=1)
    assert plan.rounds == 5
    assert plan.grid.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
    assert plan.switches() == {1: [(0, 0), (1, 0)], 2: [(2, 0), (3, 0)]}
    assert plan.first_finished() == {0: 1} and plan.last_left() == {0: 2}


def test_paced_leaders_switch_offset_rounds_early_and_stay_on_their_last_task():
    plan = paced(ScheduleInput(num_clients=4, num_tasks=3, rounds_per_task=4, seed=0), group=2, offset=2)
    assert plan.rounds == 12  # the synchronous run's length
    assert plan.grid.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2],
                                  [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2], [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]]
    assert plan.switches() == {1: [(2, 0), (3, 0)], 3: [(0, 0), (1, 0)], 5: [(2, 1), (3, 1)], 7: [(0, 1), (1, 1)]}


def _fed_cprompt_pacing(num_clients: int, num_tasks: int, num_rounds: int, pacing: int = 1) -> list[list[int]]:
    """The task of each client at each round, as Fed-CPrompt's ``trainer_pacing_clients.py`` assigns it (commit
    a19c98b: ``group_2`` = clients 5-9 of 10 set to ``task_no + pacing`` at ``round_ == int(num_rounds / 2)`` while
    ``task_no < num_tasks - pacing``; ``group_1`` and, at task 0, ``group_2`` set to ``task_no`` at round 0)."""
    group_1, group_2 = set(range(num_clients // 2)), set(range(num_clients // 2, num_clients))
    client_task = {c: 0 for c in range(num_clients)}
    grid: list[list[int]] = [[] for _ in range(num_clients)]
    for task_no in range(num_tasks):
        for round_ in range(num_rounds):
            for client in range(num_clients):
                if round_ == 0:
                    if client in group_1 or (client in group_2 and task_no == 0):
                        client_task[client] = task_no
                elif round_ == int(num_rounds / 2) and task_no < num_tasks - pacing and client in group_2:
                    client_task[client] = task_no + pacing
                grid[client].append(client_task[client])
    return grid


@pytest.mark.parametrize(("num_tasks", "num_rounds"), [(3, 4), (4, 5), (10, 40)])
def test_paced_is_fed_cprompts_asynchronous_clients(num_tasks, num_rounds):
    """Half the clients about half a task ahead: the official trainer's assignment (above), round for round."""
    plan = paced(ScheduleInput(num_clients=10, num_tasks=num_tasks, rounds_per_task=num_rounds, seed=0), group=5,
                 offset=num_rounds - int(num_rounds / 2))  # the switch at round int(num_rounds / 2)
    assert plan.grid.tolist() == _fed_cprompt_pacing(10, num_tasks, num_rounds)


def test_synchronous_joining_is_glfcs_protocol():
    """join_per_task: the old clients_join_per_task, clients 0..joined(t)-1 in task t."""
    cfg = tiny_config(num_clients=9, clients_per_round=4, clients_join_per_task=2, stream={"name": "split-digits",
                                                                                           "num_tasks": 3})
    grid = build_plan(cfg, 3).grid
    for t in range(3):
        column = grid[:, t * cfg.rounds_per_task]
        assert (column >= 0).sum() == cfg.clients_joined(t, 3)
        assert set(column[column >= 0].tolist()) == {t}


def test_subset_orders_share_the_overlap_with_the_previous_client():
    plan = per_client_order(ScheduleInput(num_clients=3, num_tasks=4, rounds_per_task=1, seed=0), order="subset",
                            tasks_per_client=2, overlap=1)
    orders = [line.order for line in plan.timelines]
    assert all(len(o) == 2 for o in orders)
    assert orders[0][1] == orders[1][0] and orders[1][1] == orders[2][0]


def test_late_joiners_and_leavers_are_absent_outside_their_rounds():
    plan = staggered(ScheduleInput(num_clients=3, num_tasks=2, rounds_per_task=2, seed=0), offset=0, late_clients=1,
                     join_round=1, leave_clients=1, leave_round=3)
    assert plan.grid.tolist() == [[0, 0, 1, -1, -1], [0, 0, 1, 1, 1], [-1, 0, 0, 1, 1]]  # last task to the end


@pytest.mark.parametrize(("schedule", "words"), [
    ({"name": "per_client_order", "order": "subset", "tasks_per_client": 1}, ["gives task(s) [", "to no client",
                                                                               "tasks_per_client"]),
    ({"name": "staggered", "leave_clients": 1, "leave_round": 2, "late_clients": 1, "join_round": 5},
     ["no client in global round(s) [2, 3, 4]", "join_round"]),
    ({"name": "per_client_order", "group": 2}, ["'schedule.group: 2' has no effect", "staggered"]),
    ({"name": "synchronous", "seed": 3}, ["'schedule.seed: 3' has no effect"]),
    ({"name": "per_client_order", "order": "stream"}, ["that is schedule.name: synchronous"]),
    ({"name": "warped"}, ["unknown schedule 'schedule.name: warped'", "staggered"]),
    ({"name": "staggered", "group": 3}, ["'schedule.group: 3' is above num_clients (2)", "nothing is staggered"]),
    ({"name": "paced", "group": 2}, ["'schedule.group: 2' must be below num_clients (2)", "half the clients"]),
    ({"name": "paced", "offset": 0}, ["'schedule.offset: 0' must be from 1 to", "skip one"]),
    ({"name": "paced", "every": 2, "offset": 2}, ["'schedule.offset: 2' must be from 1 to 1", "half a task, 1"]),
    ({"name": "staggered", "leave_clients": 1, "leave_round": 500},
     ["'schedule.leave_round: 500' is at or after the run's end", "never leave", "below"]),
])
def test_a_schedule_that_cannot_run_is_refused_with_the_fix(schedule, words):
    with pytest.raises(ConfigError) as err:
        tiny_config(num_clients=2, clients_per_round=2, stream={"name": "split-digits", "num_tasks": 3},
                    schedule=schedule)
    for w in words:
        assert w in str(err.value)


def test_a_method_refuses_the_schedules_it_cannot_run_under():
    from cfl.methods import METHODS
    from cfl.methods.base import Method

    class OneTask(Method):
        name = "one-task"
        requires = Requires(schedules=("synchronous",),
                            schedules_why="it solves the head of the server's one current task")

    with METHODS.temporarily("one-task", OneTask), pytest.raises(
            ConfigError, match="method one-task runs under schedule synchronous only: it solves the head"):
        tiny_config(method={"name": "one-task"}, schedule={"name": "staggered"})


def test_the_old_joining_key_is_refused_beside_another_schedule():
    with pytest.raises(ConfigError, match="'clients_join_per_task: 1' is GLFC's joining protocol"):
        tiny_config(num_clients=7, clients_join_per_task=1, schedule={"name": "staggered"})


def test_every_schedule_is_listed():
    assert list(SCHEDULES) == ["synchronous", "staggered", "paced", "per_client_order", "random"]


@pytest.mark.parametrize("scenario", ["task", "class"])
def test_the_schedule_metrics_of_a_synchronous_run_are_todays(scenario):
    """Under the synchronous schedule f_j is task j's last evaluation: ACC, FGT, BWT are the matrix's."""
    runner = Runner(tiny_config(method={"name": "ewc"}, eval_every=1, stream={"name": "split-digits", "num_tasks": 3}),
                    make_stream(scenario, num_tasks=3))
    runner.run()
    a = runner.progress.acc_matrix
    metrics = scheduled_metrics(runner.progress.evaluations, runner.plan)
    assert metrics["fgt"] == pytest.approx(forgetting(a), abs=1e-12)
    assert metrics["bwt"] == pytest.approx(backward_transfer(a), abs=1e-12)
    assert metrics["acc"] == pytest.approx(float(np.mean(a[-1])), abs=1e-12)
    # every client has the stream's order: each one's own matrix is the run's
    assert metrics["clients"]["0"]["acc_matrix"] == [row[: i + 1] + [None] * (2 - i) for i, row in enumerate(a)]


def test_the_metrics_of_a_staggered_run_by_hand():
    """Two tasks; clients 0-1 switch after round 2, 2-3 after round 3 (global, 1-based); 5 rounds in all."""
    plan = staggered(ScheduleInput(num_clients=4, num_tasks=2, rounds_per_task=2, seed=0), group=2, offset=1)
    evaluations = [{"round": 2, "acc": {"0": 50.0, "1": 10.0}}, {"round": 3, "acc": {"0": 40.0, "1": 30.0}},
                   {"round": 5, "acc": {"0": 20.0, "1": 70.0}}]
    m = scheduled_metrics(evaluations, plan, "first_finisher")
    assert m["acc"] == 45.0
    assert m["fgt_per_task"] == {"0": 30.0} and m["fgt"] == 30.0 and m["bwt"] == -30.0  # from round 2: 50 -> 20
    assert scheduled_metrics(evaluations, plan)["fgt_per_task"] == {"0": 20.0}  # default: its last holders', 40
    assert m["clients"]["0"]["fgt"] == 30.0 and m["clients"]["2"]["fgt"] == 20.0  # from each own switch: 50, 40
    assert m["clients"]["2"]["acc_matrix"] == [[40.0, None], [20.0, 70.0]]
    assert m["client_fgt_mean"] == 25.0


def test_a_scheduled_run_trains_each_client_on_its_own_task():
    cfg = tiny_config(schedule={"name": "staggered", "group": 3, "offset": 2}, eval_every=1)
    runner = Runner(cfg, make_stream("class", num_tasks=2))
    seen = []
    real = runner.trainer

    def trainer(model, params, jobs, x, y, task, *rest):
        seen.append((runner.progress.global_round, task, [j.cid for j in jobs]))
        return real(model, params, jobs, x, y, task, *rest)

    runner.trainer = trainer
    runner.run()
    grid = runner.plan.grid
    assert runner.progress.global_round == runner.plan.rounds == 8
    for rnd, task, cids in seen:
        assert all(grid[c, rnd] == task for c in cids)
    assert any(len({t for r, t, _ in seen if r == rnd}) == 2 for rnd in range(8))  # a round of two tasks
    results = build_results(runner.snapshot(), 0.0)
    assert results["complete"] and results["schedule"]["name"] == "staggered"
    assert results["acc"] == results["schedule"]["acc"] and results["aia"] == results["schedule"]["aia"] is not None
    assert results["fwt"] is None  # class-incremental: not measured


def test_a_run_from_before_schedules_resumes_and_groups_as_a_synchronous_one():
    from pathlib import Path

    from cfl.engine.stores.checkpoint import config_changes
    from cfl.report.groups import Run, compared_keys

    cfg = tiny_config()
    old = {k: v for k, v in cfg.to_dict().items() if k != "schedule"}
    assert config_changes(old, cfg) == ""
    assert compared_keys(Run(Path("old/results.json"), {}, old)) == compared_keys(
        Run(Path("new/results.json"), {}, cfg.to_dict()))


@pytest.mark.parametrize("name", ["synchronous", "staggered", "paced", "per_client_order", "random"])
def test_the_checks_read_the_stretches_as_the_grid_has_them(name):
    """check_plan and last_left read each client's stretches (Plan.intervals), never the dense clients x rounds
    grid, which a large synchronous config (123,456 clients x 197,530 rounds: 182 GiB) cannot form: the counts
    they read are the grid's."""
    extra = {"staggered": {"group": 2, "offset": 1}, "random": {"spread": 2}}.get(name, {})
    plan = build_plan(tiny_config(num_clients=6, schedule={"name": name, **extra}), 3)
    grid = plan.grid
    assert plan.clients_per_round().tolist() == (grid >= 0).sum(0).tolist()
    by_grid = {t: int(np.flatnonzero((grid == t).any(0))[-1]) for t in range(3) if (grid == t).any()}
    assert plan.last_left() == {t: r for t, r in by_grid.items() if r < plan.rounds - 1}


def test_a_large_synchronous_config_validates_without_forming_the_grid():
    cfg = tiny_config(num_clients=123456, clients_per_round=6, rounds_per_task=98765)
    assert build_plan(cfg, 2).clients_per_round()[-1] == 123456


def test_a_per_client_order_run_with_a_task_finished_before_another_started_writes_its_results():
    """3 tasks, 3 clients switching every round, orders [1, 2, 0], [1, 2, 0], [1, 0, 2] (seed 0): task 1 is first
    finished before any client has started task 0, so ``acc_matrix[1][0]`` is None; the synchronous matrix
    metrics (AIA reads that cell) are not computed under a schedule, whose own metrics (AIA over its task-end
    evaluations, FWT over the tasks first started after round 0) replace them."""
    cfg = tiny_config(num_clients=3, clients_per_round=3, seed=0, stream={"name": "split-digits", "num_tasks": 3},
                      schedule={"name": "per_client_order", "every": 1})
    runner = Runner(cfg, make_stream("task", num_tasks=3))
    assert [line.order for line in runner.plan.timelines] == [[1, 2, 0], [1, 2, 0], [1, 0, 2]]
    runner.run()
    assert runner.progress.acc_matrix[1][0] is None
    results = build_results(runner.snapshot(), 0.0)
    assert results["complete"] and results["acc"] == results["schedule"]["acc"]
    assert results["aia"] == results["schedule"]["aia"] is not None
    # task 1 starts at round 0, tasks 2 and 0 at round 1: FWT is the mean of their terms
    before, init = results["acc_before_task"], results["acc_init"]
    assert before[1] is None and results["fwt"] == pytest.approx((before[0] - init[0] + before[2] - init[2]) / 2,
                                                                 abs=1e-12)


def test_a_staggered_run_of_hundreds_of_thousands_of_rounds_is_said():
    """``offset`` 100,000 on 3 groups: a run of 200,000+ rounds that the config's rounds_per_task does not
    suggest; the plan's check says how long it is (printed before training)."""
    from cfl.schedule_checks import check_plan

    plan = staggered(ScheduleInput(num_clients=3, num_tasks=2, rounds_per_task=2, seed=0), offset=100_000)
    notes = check_plan(plan, 1)
    assert plan.rounds > 200_000 and any(f"{plan.rounds:,} global rounds" in n and "schedule.offset" in n
                                         for n in notes), notes
    short = staggered(ScheduleInput(num_clients=3, num_tasks=2, rounds_per_task=2, seed=0), offset=1)
    assert check_plan(short, 1) == []
