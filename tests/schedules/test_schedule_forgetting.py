"""``schedule.forgetting``: when a task counts as learned under a schedule (cfl/metrics/asynchronous.py), and AIA and
FWT under every schedule. The numbers of the hand-computed run are docs/concepts.md's worked example."""

from __future__ import annotations

import pytest

from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.metrics.asynchronous import scheduled_metrics
from cfl.metrics.matrix import average_incremental_accuracy, forgetting, forward_transfer
from cfl.metrics.results import build_results
from cfl.schedules import ScheduleInput, staggered
from tests.conftest import make_stream, tiny_config


def worked_example():
    """Two clients, three tasks, two rounds per task, client 1 two rounds behind client 0 (``offset: 2``):

    round (0-based)  01234567
    client 0         00112222
    client 1         00001122

    Client 0 leaves task 0 after round 1, when the global model has barely learned it (8 %); client 1, its last
    holder, after round 3 (62 %). Evaluations follow rounds 2, 4, 6 (1-based; each a switch) and 8 (the last)."""
    plan = staggered(ScheduleInput(num_clients=2, num_tasks=3, rounds_per_task=2, seed=0), group=1, offset=2)
    assert plan.grid.tolist() == [[0, 0, 1, 1, 2, 2, 2, 2], [0, 0, 0, 0, 1, 1, 2, 2]]
    evaluations = [{"round": 2, "acc": {"0": 8.0}},
                   {"round": 4, "acc": {"0": 62.0, "1": 40.0}},
                   {"round": 6, "acc": {"0": 50.0, "1": 58.0, "2": 30.0}},
                   {"round": 8, "acc": {"0": 44.0, "1": 46.0, "2": 66.0}}]
    before, init = {"1": 20.0, "2": 25.0}, [10.0, 10.0, 10.0]  # tasks 1 and 2 first start at rounds 2 and 4
    return plan, evaluations, before, init


def test_last_finisher_counts_from_the_round_the_last_holder_left_the_task():
    """The default: task 0 learned at round 4 (62), task 1 at round 6 (58): FGT = ((62-44) + (58-46)) / 2 = 15;
    AIA over rounds 4, 6, 8: (51 + 46 + 52) / 3."""
    plan, evaluations, before, init = worked_example()
    m = scheduled_metrics(evaluations, plan, "last_finisher", before, init)
    assert m["forgetting"] == "last_finisher" and m["learned_round"] == {"0": 4, "1": 6}
    assert m["acc"] == 52.0
    assert m["fgt_per_task"] == {"0": 18.0, "1": 12.0} and m["fgt"] == 15.0 and m["bwt"] == -15.0
    assert m["aia"] == pytest.approx((51.0 + 46.0 + 52.0) / 3, abs=1e-12)
    assert m["fwt"] == 12.5  # ((20 - 10) + (25 - 10)) / 2
    assert scheduled_metrics(evaluations, plan)["fgt"] == 15.0  # the default


def test_first_finisher_counts_from_the_round_some_client_first_left_the_task():
    """cfl's earlier reading: task 0 learned at round 2 (8, never learned), task 1 at round 4 (40): FGT =
    ((8-44) + (40-46)) / 2 = -21, a gain where the task was forgotten; AIA over rounds 2, 4, 8: (8 + 51 + 52) / 3."""
    plan, evaluations, before, init = worked_example()
    m = scheduled_metrics(evaluations, plan, "first_finisher", before, init)
    assert m["learned_round"] == {"0": 2, "1": 4}
    assert m["acc"] == 52.0
    assert m["fgt_per_task"] == {"0": -36.0, "1": -6.0} and m["fgt"] == -21.0 and m["bwt"] == 21.0
    assert m["aia"] == pytest.approx(37.0, abs=1e-12)
    assert m["fwt"] == 12.5  # FWT reads no task end


def test_the_clients_own_metrics_read_their_own_switches_under_both():
    plan, evaluations, before, init = worked_example()
    for name in ("last_finisher", "first_finisher"):
        m = scheduled_metrics(evaluations, plan, name, before, init)
        assert m["clients"]["0"]["acc_matrix"] == [[8.0, None, None], [62.0, 40.0, None], [44.0, 46.0, 66.0]]
        assert m["clients"]["0"]["fgt"] == -21.0 and m["clients"]["1"]["fgt"] == 15.0
        assert m["client_fgt_mean"] == -3.0


def test_fwt_is_none_without_a_measured_term():
    plan, evaluations, _, init = worked_example()
    assert scheduled_metrics(evaluations, plan, "last_finisher", {"1": 20.0}, init)["fwt"] is None
    assert scheduled_metrics(evaluations, plan, "last_finisher", None, None)["fwt"] is None


@pytest.mark.parametrize("scenario", ["task", "class"])
def test_both_readings_are_the_matrix_metrics_under_the_synchronous_schedule(scenario):
    """Under synchronous each task's first finisher is its last holder: FGT, BWT, AIA and FWT of both readings are
    the matrix's, exactly (results.json's synchronous numbers are the matrix's, unchanged)."""
    cfg = tiny_config(method={"name": "ewc"}, eval_every=1, stream={"name": "split-digits", "num_tasks": 3})
    runner = Runner(cfg, make_stream(scenario, num_tasks=3))
    runner.run()
    prog, a = runner.progress, runner.progress.acc_matrix
    before = [prog.acc_before_task.get(str(i)) for i in range(3)]
    results = build_results(runner.snapshot(), 0.0)
    for name in ("last_finisher", "first_finisher"):
        m = scheduled_metrics(prog.evaluations, runner.plan, name, prog.acc_before_task, prog.acc_init)
        assert m["fgt"] == forgetting(a) == results["fgt"]
        assert m["bwt"] == results["bwt"]
        assert m["aia"] == average_incremental_accuracy(a) == results["aia"]
        assert m["fwt"] == forward_transfer(before, prog.acc_init, 2) == results["fwt"]
    assert (results["fwt"] is None) == (scenario == "class")


def test_a_staggered_run_reports_aia_and_fwt_and_the_reading_it_took():
    cfg = tiny_config(schedule={"name": "staggered", "group": 3, "offset": 2}, eval_every=1)
    runner = Runner(cfg, make_stream("task", num_tasks=2))
    runner.run()
    prog = runner.progress
    assert list(prog.acc_before_task) == ["1"]  # task 1 first starts after round 0: measured just before
    results = build_results(runner.snapshot(), 0.0)
    assert results["schedule"]["forgetting"] == "last_finisher"
    assert results["aia"] == results["schedule"]["aia"] is not None
    assert results["fwt"] == pytest.approx(prog.acc_before_task["1"] - prog.acc_init[1], abs=1e-12)
    first = scheduled_metrics(prog.evaluations, runner.plan, "first_finisher")
    # task 0 was first finished 2 rounds before its last holders left it: the rows differ, so may the FGTs
    assert results["schedule"]["learned_round"] != first["learned_round"]
    assert results["acc_matrix"][0] == [prog.evaluations[[e["round"] for e in prog.evaluations].index(
        results["schedule"]["learned_round"]["0"])]["acc"].get(str(k)) for k in range(2)]


def test_an_unknown_reading_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"'schedule.forgetting' must be one of \['last_finisher', "
                                          r"'first_finisher'\], got 'fastest'"):
        tiny_config(schedule={"name": "staggered", "forgetting": "fastest"})


def test_the_reading_is_refused_under_synchronous_where_both_are_one():
    with pytest.raises(ConfigError, match="'schedule.forgetting: first_finisher' has no effect"):
        tiny_config(schedule={"name": "synchronous", "forgetting": "first_finisher"})
    tiny_config(schedule={"name": "staggered", "forgetting": "first_finisher"})  # read there


def test_a_record_from_before_the_key_groups_as_the_reading_it_was_computed_with():
    from pathlib import Path

    from cfl.report.groups import Run, compared_keys

    sync, stag = tiny_config(), tiny_config(schedule={"name": "staggered", "forgetting": "first_finisher"})

    def old(cfg):
        d = cfg.to_dict()
        return {**d, "schedule": {k: v for k, v in d["schedule"].items() if k != "forgetting"}}

    assert compared_keys(Run(Path("a/results.json"), {}, old(sync))) == compared_keys(
        Run(Path("b/results.json"), {}, sync.to_dict()))
    assert compared_keys(Run(Path("a/results.json"), {}, old(stag))) == compared_keys(
        Run(Path("b/results.json"), {}, stag.to_dict()))


def test_a_checkpoint_from_before_the_key_resumes():
    from cfl.engine.stores.checkpoint import config_changes

    cfg = tiny_config(schedule={"name": "staggered"})
    d = cfg.to_dict()
    saved = {**d, "schedule": {k: v for k, v in d["schedule"].items() if k != "forgetting"}}
    assert config_changes(saved, cfg) == ""
