"""metrics.jsonl: one line per round (loss, clients, this round's bytes and the totals) and per evaluation."""

import json

from cfl.engine.rounds.runner import Runner
from cfl.report.jsonl import MetricsWriter
from cfl.validation import from_dict
from tests.conftest import make_stream


class Recorder:
    """What W&B's logger is handed each round."""

    def __init__(self) -> None:
        self.rounds = []

    def round_end(self, record):
        self.rounds.append(dict(record))

    def evaluation(self, record):
        pass

    def task_end(self, task, record):
        pass


def test_one_line_per_round_with_its_traffic_and_one_per_evaluation(tmp_path):
    cfg = from_dict({"num_clients": 5, "clients_per_round": 3, "rounds_per_task": 3, "batch_size": 8, "lr": 0.1,
                     "eval_every": 2, "wandb": {"mode": "disabled"}, "method": {"name": "ewc"}})
    recorder = Recorder()
    runner = Runner(cfg, make_stream("domain", num_tasks=2), [MetricsWriter(tmp_path / "m.jsonl"), recorder])
    runner.run()
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    # per task: round 1, evaluation at round 2 then round 2's line, round 3, the task-end evaluation
    assert [(x["kind"], x["round"]) for x in lines] == [
        ("round", 1), ("evaluation", 2), ("round", 2), ("round", 3), ("evaluation", 3),
        ("round", 4), ("evaluation", 5), ("round", 5), ("round", 6), ("evaluation", 6)]
    rounds = [x for x in lines if x["kind"] == "round"]
    assert [{k: v for k, v in x.items() if k != "kind"} for x in rounds] == recorder.rounds  # as W&B gets them
    model = runner.model_bytes
    for x in rounds:
        assert x["clients"] == 3 and x["round_upload_bytes"] == x["round_download_bytes"] == 3 * model
        assert x["train_loss"] > 0
    # totals: the rounds' traffic, plus EWC's task-end model download to all 5 clients after task 0
    assert [x["download_bytes"] for x in rounds] == [3 * model * r + 5 * model * (r > 3) for r in range(1, 7)]
    assert [x["upload_bytes"] for x in rounds] == [3 * model * r for r in range(1, 7)]


def test_each_round_line_says_its_seconds_and_the_runs_wall_seconds(tmp_path):
    """A round's wall time (``seconds``) and the run's so far (``wall_seconds``), on its line only: timings, which
    benchmarks/bit_for_bit.py and the resume comparisons drop (cfl.report.jsonl.TIMING_KEYS)."""
    import importlib.util
    from pathlib import Path

    from cfl.report.jsonl import TIMING_KEYS, without_timing

    cfg = from_dict({"num_clients": 4, "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 8, "lr": 0.1,
                     "wandb": {"mode": "disabled"}})
    runner = Runner(cfg, make_stream("domain", num_tasks=2), [MetricsWriter(tmp_path / "m.jsonl")])
    runner.run()
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    rounds = [x for x in lines if x["kind"] == "round"]
    assert len(rounds) == 4 and all(isinstance(x["seconds"], float) and x["seconds"] > 0 for x in rounds)
    walls = [x["wall_seconds"] for x in rounds]
    assert walls == sorted(walls) and walls[-1] <= runner.progress.wall_seconds
    assert all(x["seconds"] <= x["wall_seconds"] for x in rounds)
    assert not any(k in x for x in lines if x["kind"] == "evaluation" for k in TIMING_KEYS)
    assert not set(TIMING_KEYS) & set(without_timing(rounds[0]))
    spec = importlib.util.spec_from_file_location("bit_for_bit", Path(__file__).parents[2] / "benchmarks" /
                                                  "bit_for_bit.py")
    bit_for_bit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bit_for_bit)
    assert bit_for_bit.differing_keys(rounds[0], {**rounds[0], "seconds": 9.0, "wall_seconds": 99.0}) == []
