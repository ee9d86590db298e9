import pytest

from cfl.config.keys import Config
from cfl.engine.rounds.runner import Runner
from cfl.metrics import matrix
from cfl.metrics.evaluate import accuracy
from cfl.metrics.matrix import average_accuracy, backward_transfer, forgetting, rounds_to_targets
from cfl.metrics.results import build_results, targets_per_task
from cfl.validation import from_dict
from tests.conftest import make_stream

MATRIX = [
    [90.0, None, None],
    [80.0, 70.0, None],
    [60.0, 65.0, 95.0],
]


def test_acc_is_mean_of_last_row():
    assert average_accuracy(MATRIX) == pytest.approx((60 + 65 + 95) / 3)


def test_fgt_is_mean_drop_from_diagonal():
    # (90 - 60) and (70 - 65) over the T-1 = 2 earlier tasks
    assert forgetting(MATRIX) == pytest.approx((30 + 5) / 2)
    assert backward_transfer(MATRIX) == pytest.approx(-17.5)


def test_metrics_after_an_intermediate_task():
    assert average_accuracy(MATRIX, after=1) == pytest.approx(75.0)
    assert forgetting(MATRIX, after=1) == pytest.approx(10.0)
    assert forgetting(MATRIX, after=0) == 0.0


def test_rounds_to_targets():
    curve = [(5, 40.0), (10, 86.0), (15, 91.0), (20, 89.0)]
    assert rounds_to_targets(curve, [85, 90, 95]) == {"85": 10, "90": 15, "95": None}


def test_an_accuracy_equal_to_the_target_reaches_it():
    """"Reaches" is ``>=`` (``>`` would give 85 at round 10 and 90 never)."""
    assert rounds_to_targets([(5, 85.0), (10, 90.0)], [85, 90]) == {"85": 5, "90": 10}
    assert rounds_to_targets([(5, 84.999)], [85]) == {"85": None}


def _evaluation(task, rnd, *accs):
    return {"task": task, "round": rnd, "acc": {str(j): a for j, a in enumerate(accs)}}


def test_rounds_to_target_counts_each_task_from_its_start_on_its_own_accuracy():
    evaluations = [_evaluation(0, 5, 70.0), _evaluation(0, 10, 92.0),
                   _evaluation(1, 15, 88.0, 55.0), _evaluation(1, 20, 85.0, 91.0)]
    # task 1's own curve is (5, 55) (10, 91); task 0's accuracy (88 then 85) and the mean (71.5 then 88)
    # would reach 60 at round 5 and 90 never
    assert targets_per_task(evaluations, [60, 90], rounds_per_task=10) == {
        "0": {"60": 5, "90": 10}, "1": {"60": 10, "90": 10}}


def test_target_accuracies_documented_as_each_tasks_own_accuracy():
    doc = Config.__dataclass_fields__["target_accuracies"].metadata["doc"]
    assert "own test accuracy" in doc and "mean" not in doc


# ---- average incremental accuracy, forward transfer, per-class accuracy ----
def test_average_incremental_accuracy_is_the_mean_of_acc_after_each_task():
    # ACC after task 0: 90; after task 1: (80 + 70) / 2 = 75; after task 2: (60 + 65 + 95) / 3 = 73.33
    assert matrix.average_incremental_accuracy(MATRIX) == pytest.approx((90 + 75 + 220 / 3) / 3)  # 79.44
    assert matrix.average_incremental_accuracy(MATRIX, after=1) == pytest.approx((90 + 75) / 2)
    assert matrix.average_incremental_accuracy(MATRIX, after=0) == 90.0


def test_forward_transfer_is_gems_mean_of_accuracy_before_training_less_the_initial_models():
    before = [None, 40.0, 30.0]  # task i before training it (after task i-1): GEM's R[i-1][i]
    init = [10.0, 20.0, 35.0]  # the randomly initialised model: GEM's b_i
    assert matrix.forward_transfer(before, init, after=2) == pytest.approx(((40 - 20) + (30 - 35)) / 2)  # 7.5
    assert matrix.forward_transfer(before, init, after=1) == pytest.approx(20.0)
    assert matrix.forward_transfer(before, init, after=0) is None  # no task had a predecessor
    assert matrix.forward_transfer([None, 40.0, None], init, after=2) is None  # a term not measured
    assert matrix.forward_transfer(before, [], after=2) is None  # resumed from a checkpoint without the initial model's


def _metric_cfg():
    return from_dict({"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 1, "batch_size": 8, "lr": 0.1,
                      "wandb": {"mode": "disabled"}})


class _NextTask:
    """Observer: at each task end, the accuracy of the model the next task starts from."""

    def __init__(self, runner):
        self.runner, self.seen = runner, {}

    def round_end(self, record):
        pass

    def evaluation(self, record):
        pass

    def task_end(self, task, record):
        r = self.runner
        if task + 1 < r.stream.num_tasks:
            t = r.stream.tasks[task + 1]
            self.seen[task + 1] = accuracy(r.model, r.params, t.test_x, t.test_y, task + 1)


@pytest.mark.parametrize("scenario", ["task", "domain"])
def test_a_run_measures_forward_transfer_against_the_initial_model(scenario):
    stream = make_stream(scenario, num_tasks=3)
    runner = Runner(_metric_cfg(), stream)
    init = [accuracy(runner.model, runner.params, t.test_x, t.test_y, j) for j, t in enumerate(stream.tasks)]
    watch = _NextTask(runner)
    runner.observers.append(watch)
    runner.run()
    results = build_results(runner.snapshot(), 0.0)
    assert results["acc_init"] == init and results["acc_before_task"] == [None, watch.seen[1], watch.seen[2]]
    assert results["fwt"] == pytest.approx(((watch.seen[1] - init[1]) + (watch.seen[2] - init[2])) / 2)
    rows = results["acc_matrix"]
    assert results["aia"] == pytest.approx((rows[0][0] + sum(rows[1][:2]) / 2 + sum(rows[2]) / 3) / 3)
    assert "class_acc" not in results


def test_a_class_incremental_run_reports_per_class_accuracy_and_no_forward_transfer():
    stream = make_stream("class", num_tasks=2)  # classes 0-2 in task 0, 3-5 in task 1; 10 test samples each
    assert [len(t.test_y) for t in stream.tasks] == [30, 30]
    runner = Runner(_metric_cfg(), stream)
    runner.run()
    results = build_results(runner.snapshot(), 0.0)
    per_class = results["class_acc"]
    assert sorted(per_class, key=int) == ["0", "1", "2", "3", "4", "5"]
    assert all(v * 10 / 100 == pytest.approx(round(v * 10 / 100)) for v in per_class.values())  # k of 10 right
    for task, classes in enumerate((["0", "1", "2"], ["3", "4", "5"])):  # equal class sizes: the task's mean
        assert sum(per_class[c] for c in classes) / 3 == pytest.approx(results["acc_matrix"][1][task])
    assert results["fwt"] is None and results["acc_init"] is None and results["acc_before_task"] is None


class _SummaryRun:
    def __init__(self):
        self.summary, self.logged = {}, []

    def log(self, data, step=None):
        self.logged.append(data)

    def finish(self):
        pass


def test_the_new_metrics_reach_the_wandb_summary(tmp_path):
    from cfl.report.wandb_log import WandbLogger

    cfg = from_dict({"wandb": {"mode": "disabled", "log_artifacts": False}})
    logger = WandbLogger(cfg, tmp_path)
    logger.run = run = _SummaryRun()
    results = {"acc_matrix": [[90.0, None], [80.0, 70.0]], "acc": 75.0, "fgt": 10.0, "bwt": -10.0, "aia": 82.5,
               "fwt": None, "wall_seconds": 1.0, "upload_bytes": 2, "download_bytes": 3,
               "class_acc": {"0": 100.0, "3": 40.0}}
    logger.finish(results, tmp_path, [])
    assert {k: run.summary[k] for k in ("aia", "fwt", "class_acc/0", "class_acc/3")} == {
        "aia": 82.5, "fwt": None, "class_acc/0": 100.0, "class_acc/3": 40.0}


def test_a_clients_acc_is_the_mean_over_every_task_it_held_the_last_included():
    from cfl.metrics.asynchronous import scheduled_metrics
    from cfl.schedules import ScheduleInput, staggered

    plan = staggered(ScheduleInput(num_clients=4, num_tasks=2, rounds_per_task=2, seed=0), group=2, offset=1)
    evaluations = [{"round": 2, "acc": {"0": 50.0, "1": 10.0}}, {"round": 3, "acc": {"0": 40.0, "1": 30.0}},
                   {"round": 5, "acc": {"0": 20.0, "1": 70.0}}]
    m = scheduled_metrics(evaluations, plan)
    # every client holds tasks 0 then 1: its ACC is the final row's mean, (20 + 70) / 2, not task 0's 20 alone
    assert [m["clients"][str(c)]["acc"] for c in range(4)] == [45.0] * 4
    assert m["client_acc_mean"] == 45.0
