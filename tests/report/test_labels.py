"""Labels name every result-affecting setting that differs (cfl/report/labels.py): the partition's parameters,
the scenario, method parameters away from their defaults, a sweep variant's label; in table rows, figure
legends and W&B names alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from cfl.app.sweep import load_sweep
from cfl.report.compare_data import legend_names
from cfl.report.groups import group_runs, load_runs
from cfl.report.table import report
from cfl.report.wandb_names import default_group, default_name
from tests.report.test_report import rows


def write(path: Path, seed: int = 0, method_label: str = "fedavg", scenario: str | None = None, **config: Any) -> None:
    """A finished run's results.json (``method_label``: its ``method`` field); ``config`` keys replace those of
    a resolved config with an iid partition."""
    path.mkdir(parents=True)
    config = {"seed": seed, "lr": 0.05, "partition": {"name": "iid", "alpha": 0.5}, **config}
    body: dict[str, Any] = {"stream": "split-digits", "partition": config["partition"]["name"], "method": method_label,
                            "seed": seed, "acc": 70.0, "fgt": 1.0, "complete": True, "config": config}
    if scenario is not None:
        body["scenario"] = scenario
    (path / "results.json").write_text(json.dumps(body))


def test_the_partition_column_names_the_dirichlet_alpha(tmp_path):
    write(tmp_path / "iid")
    write(tmp_path / "dir", partition={"name": "dirichlet", "alpha": 0.1, "min_samples": 1})
    found = rows(report([tmp_path]))
    # before: "dirichlet" and "iid", alpha nowhere
    assert [r["partition"] for r in found] == ["dirichlet alpha=0.1", "iid"]


def test_a_lone_fedprox_row_names_its_mu_away_from_the_default(tmp_path):
    write(tmp_path / "avg")
    write(tmp_path / "prox", 0, "fedprox", method={"name": "fedprox", "mu": 1.0})
    assert [r["method"] for r in rows(report([tmp_path]))] == ["fedavg", "fedprox method.mu=1.0"]  # before: "fedprox"


def test_a_method_parameter_left_out_and_given_at_its_default_are_one_row(tmp_path):
    write(tmp_path / "a", 0, "fedprox", method={"name": "fedprox"})
    write(tmp_path / "b", 1, "fedprox", method={"name": "fedprox", "mu": 0.01})  # fedprox's default
    assert [(r["method"], r["seeds"]) for r in rows(report([tmp_path]))] == [("fedprox", "0,1")]


def test_the_stream_column_names_the_scenario_and_auto_groups_with_what_it_resolved_to(tmp_path):
    write(tmp_path / "auto", 0, "er", scenario="class", stream={"name": "split-digits", "scenario": "auto"})
    write(tmp_path / "class", 1, "er", scenario="class", stream={"name": "split-digits", "scenario": "class"})
    write(tmp_path / "task", 0, "er", scenario="task", stream={"name": "split-digits", "scenario": "task"})
    found = rows(report([tmp_path]))
    # before: one stream "split-digits", method "er stream.scenario=auto" / "=class" / "=task" in three rows
    assert [(r["stream"], r["method"], r["seeds"]) for r in found] == [
        ("split-digits (class-IL)", "er", "0,1"), ("split-digits (task-IL)", "er", "0")]


def test_a_config_label_names_the_row_and_keys_tell_apart_rows_of_one_label(tmp_path):
    for lr in (0.05, 0.5):
        write(tmp_path / f"strong{lr}", 0, "fedprox", lr=lr, label="prox-strong", method={"name": "fedprox", "mu": 1})
        write(tmp_path / f"avg{lr}", 0, lr=lr, label="plain", method={"name": "fedavg"})
    groups = group_runs(load_runs([tmp_path]))
    assert [g.label for g in groups] == ["plain lr=0.05", "plain lr=0.5", "prox-strong lr=0.05 method.mu=1",
                                         "prox-strong lr=0.5 method.mu=1"]
    # the figures' legends: the same labels, keys shortened
    assert legend_names(groups) == ["plain lr=0.05", "plain lr=0.5", "prox-strong lr=0.05 mu=1",
                                    "prox-strong lr=0.5 mu=1"]


def test_legends_use_display_names_and_short_keys(tmp_path):
    write(tmp_path / "avg")
    for lam in (10, 100):
        write(tmp_path / f"ewc{lam}", 0, "ewc+fedprox", method={"name": "ewc", "lam": lam},
              plugins=[{"name": "fedprox", "mu": 0.1}])
    assert legend_names(group_runs(load_runs([tmp_path]))) == [
        "EWC+FL + FedProx lam=10 mu=0.1", "EWC+FL + FedProx lam=100 mu=0.1", "FedAvg"]


def test_a_sweep_variant_label_reaches_the_config_and_the_wandb_names(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": {"stream": {"name": "split-digits", "num_tasks": 2}, "wandb": {"mode": "disabled"}},
        "out": str(tmp_path / "runs"),
        "grid": {"variant": [{"label": "avg", "method.name": "fedavg"},
                             {"label": "prox-1", "method": {"name": "fedprox", "mu": 1.0}}],
                 "lr": [0.05, 0.5]}}, sort_keys=False))
    runs = load_sweep(sweep)
    assert [r.config.label for r in runs] == ["avg", "avg", "prox-1", "prox-1"]  # before: no label key
    prox = runs[2]
    # before: ...-fedprox-iid-s0; the keys that differ from the sweep's base follow (unique names within a sweep)
    assert default_name(prox.config, prox.base) == "split-digits-prox-1-iid-lr=0.05,mu=1.0-s0"
    assert default_group(prox.config, prox.base).startswith("split-digits/iid/prox-1/")
    assert "label" not in default_group(prox.config, prox.base)  # the label changes no result: not a difference


def test_a_parameter_name_two_methods_share_is_compared_within_each_method(tmp_path):
    write(tmp_path / "ewc", 0, "ewc", method={"name": "ewc", "lam": 10.0})  # EWC's default lam
    write(tmp_path / "mas", 0, "mas", method={"name": "mas", "lam": 1.0})  # MAS's default lam
    # before: "ewc method.lam=10.0" and "mas method.lam=1.0", as if lam were one setting of both
    assert [r["method"] for r in rows(report([tmp_path]))] == ["ewc", "mas"]


def test_a_label_that_spells_a_setting_is_not_followed_by_it_again(tmp_path):
    write(tmp_path / "a", 0, "fedprox", label="FedProx mu=1", method={"name": "fedprox", "mu": 1.0})
    write(tmp_path / "b", 0, "fedprox", label="strong", method={"name": "fedprox", "mu": 1.0})
    assert [g.label for g in group_runs(load_runs([tmp_path]))] == ["FedProx mu=1", "strong method.mu=1.0"]
