"""The schedules table's sweeps (benchmarks/schedules/): every run validates, every scheduled row has a
synchronous twin that differs from it in ``schedule`` (and label) only, each reference schedule keeps its shape,
and the campaign table shows the rows in pairs with the schedule's own columns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cfl.app.sweep import load_sweep
from cfl.config.keys import ConfigError
from cfl.schedules import build_plan

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from campaign_plan import load_tables, table_runs  # noqa: E402
from campaign_tables import render_table  # noqa: E402

SWEEPS = {"schedules-split-fmnist": ROOT / "benchmarks/schedules/split-fmnist.yaml",
          "schedules-split-fmnist-target": ROOT / "benchmarks/schedules/split-fmnist-target.yaml"}
METHODS = {"schedules-split-fmnist": {"fedavg", "ewc", "er", "fedlwf", "glfc", "fedweit"},
           "schedules-split-fmnist-target": {"target"}}
SHAPES = {"per-client": (5, 5, "per_client_order"), "staggered": (10, 10, "staggered"),
          "random-100": (100, 10, "random")}


def _without(config, *keys):
    data = json.loads(json.dumps(config.to_dict()))
    return {k: v for k, v in data.items() if k not in keys}


@pytest.mark.parametrize("table", sorted(SWEEPS))
def test_every_scheduled_row_validates_beside_its_synchronous_twin(table, tmp_path):
    runs = load_sweep(SWEEPS[table], out=tmp_path)  # every run validated (names, schedule, method under it)
    by_label = {(r.config.label, r.config.seed): r.config for r in runs}
    scheduled = [c for c in by_label.values() if c.schedule.name != "synchronous"]
    assert len(scheduled) * 2 == len(runs) and {c.seed for c in scheduled} == {0, 1, 2}
    assert {c.method["name"] for c in scheduled} == METHODS[table]
    for config in scheduled:
        twin = by_label[(f"{config.label} synchronous", config.seed)]
        assert twin.schedule.name == "synchronous"
        assert _without(config, "schedule", "label") == _without(twin, "schedule", "label")
        clients, per_round, name = SHAPES[config.label.split()[-1]]
        assert (config.num_clients, config.clients_per_round, config.schedule.name) == (clients, per_round, name)
        if name == "staggered":  # 5 pairs, each switching `offset` rounds after the previous: still asynchronous
            plan = build_plan(config, 5)
            assert plan.rounds == 5 * config.rounds_per_task + 4 * config.schedule.offset


def test_the_table_shows_each_scheduled_row_before_its_twin_with_the_client_means(tmp_path):
    name = "schedules-split-fmnist"
    table = load_tables()[name]
    assert len(table["order"]) == len(set(table["order"])) == 36
    for i, run in enumerate(table_runs(name, table, tmp_path / "work", tmp_path / "results")):
        config = run.config
        record = {"stream": "split-fmnist", "scenario": "task", "method": config.method_label, "partition": "iid",
                  "seed": config.seed, "acc": 80.0 + i % 3, "fgt": 2.0, "complete": True, "rounds": 15,
                  "config": json.loads(json.dumps(config.to_dict())),
                  "record": {"machine": {"cpu": "cpu", "cores": 2, "torch": "2"}, "commit": "abc"}}
        if config.schedule.name != "synchronous":
            record["schedule"] = {"name": config.schedule.name, "client_acc_mean": 70.0, "client_fgt_mean": 3.0}
        run.record_dir.mkdir(parents=True)
        (run.record_dir / "results.json").write_text(json.dumps(record))
    lines = [line for line in render_table(name, table, tmp_path / "results").splitlines() if line.startswith("| ")]
    assert lines[0].split(" | ")[5:8] == ["client ACC (%)", "client FGT (%)", "rounds"]
    labels = [line.split(" | ")[0][2:] for line in lines[1:]]
    assert labels[:4] == ["fedavg per-client", "fedavg per-client synchronous", "fedavg staggered",
                          "fedavg staggered synchronous"]
    heads = [label.split(" method.")[0] for label in labels]  # GLFC's labels go on with its reduced settings
    assert all(b == f"{a} synchronous" for a, b in zip(heads[::2], heads[1::2], strict=True)) and len(heads) == 36
    assert [line.split(" | ")[5] for line in lines[1:3]] == ["70.00 ± 0.00", "–"]


def test_a_table_with_an_unknown_column_is_refused(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text("tables:\n  t: {sweeps: [benchmarks/schedules/split-fmnist.yaml], columns: [acc, clientacc]}\n")
    with pytest.raises(ConfigError, match="unknown column.*'clientacc'"):
        load_tables(path)
