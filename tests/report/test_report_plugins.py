"""A report of a plugin's runs needs no plugin file: a run records its methods' display names and
defaults in ``results.json`` (``method_info``), ``--order`` takes the labels the table and legends show, and
``cfl config-reference --plugin F`` lists the plugin's parameters."""

import json

import pytest
import yaml

from cfl import plugin_files as plugins
from cfl.app.cli import main
from cfl.methods import METHODS
from cfl.report.compare_data import legend_names
from cfl.report.groups import group_runs, load_runs
from cfl.report.labels import run_title
from tests.report.test_report import rows, write_results

PLUGIN = '''
from dataclasses import dataclass

from cfl.plugin import Method, field, register


@dataclass(frozen=True)
class Hyperparams:
    alpha: float = field(0.3, "weight of the logit replay", min=0.0)
    beta: float = field(0.5, "weight of the label replay", min=0.0)


@register
class DerPP(Method):
    name = "myderpp"
    about = "MyDER++: dark experience replay (a stand-in that trains as FedAvg)"
    Hyperparams = Hyperparams
'''

TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 1, "batch_size": 32, "lr": 0.05, "threads": 1, "wandb": {"mode": "disabled"},
        "method": {"name": "myderpp"}}


@pytest.fixture
def plugin_run(tmp_path, monkeypatch):
    """A run of the plugin's method at its defaults, then the plugin gone (a report process without it)."""
    monkeypatch.setattr(plugins, "LOADED", {})
    (tmp_path / "myderpp.py").write_text(PLUGIN)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    with METHODS.preserved():
        assert main(["run", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "runs" / "myderpp"), "--quiet",
                     "--plugin", str(tmp_path / "myderpp.py")]) == 0
    assert "myderpp" not in METHODS
    return tmp_path / "runs"


def fedavg_beside(runs):
    """The plugin run's results as FedAvg's under the same settings (written by hand: no second run)."""
    results = json.loads((runs / "myderpp" / "results.json").read_text())
    results.update(method="fedavg", method_info={"fedavg": {"display": "FedAvg", "defaults": {}}})
    results["config"]["method"] = {"name": "fedavg"}
    results["acc_matrix"][0][0] -= 1.0  # the stand-in trains as FedAvg: not FedAvg's matrix (cfl.report.same_as_fedavg)
    (runs / "fedavg").mkdir()
    (runs / "fedavg" / "results.json").write_text(json.dumps(results))


def test_a_run_records_its_methods_display_names_and_defaults(plugin_run):
    results = json.loads((plugin_run / "myderpp" / "results.json").read_text())
    assert results["method_info"] == {"myderpp": {"display": "MyDER++", "defaults": {"alpha": 0.3, "beta": 0.5}}}
    assert results["display_label"] == "MyDER++"
    assert " · MyDER++ · " in run_title(results)  # figure titles, without the plugin


def test_a_report_without_the_plugin_labels_its_rows_and_legends_as_the_sweep_does(plugin_run, capsys):
    fedavg_beside(plugin_run)
    assert main(["report", str(plugin_run)]) == 0
    labels = [r["method"] for r in rows(capsys.readouterr().out)]
    assert labels == ["fedavg", "myderpp"]  # not "myderpp method.alpha=0.3 method.beta=0.5"
    assert sorted(legend_names(group_runs(load_runs([plugin_run])))) == ["FedAvg", "MyDER++"]


@pytest.mark.parametrize("name", ["MyDER++", "myderpp", "myder++"])
def test_order_takes_the_labels_the_table_and_legends_show(plugin_run, capsys, name):
    fedavg_beside(plugin_run)
    assert main(["report", str(plugin_run), "--order", f"{name},FedAvg"]) == 0, capsys.readouterr().err
    assert [r["method"] for r in rows(capsys.readouterr().out)] == ["myderpp", "fedavg"]


def test_order_takes_a_config_label_alone(tmp_path, capsys):
    """A sweep variant's label (``Prox``) names its row where the row also shows the settings away from defaults."""
    write_results(tmp_path / "avg", 0, 50.0, 10.0, config={"label": "Avg", "method": {"name": "fedavg"}})
    write_results(tmp_path / "prox", 0, 51.0, 10.0, method="fedprox",
                  config={"label": "Prox", "method": {"name": "fedprox", "mu": 1.0}})
    assert main(["report", str(tmp_path), "--order", "Prox"]) == 0, capsys.readouterr().err
    assert [r["method"] for r in rows(capsys.readouterr().out)] == ["Prox method.mu=1.0", "Avg"]


def test_config_reference_lists_a_plugins_parameters(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plugins, "LOADED", {})
    (tmp_path / "myderpp.py").write_text(PLUGIN)
    with METHODS.preserved():
        assert main(["config-reference", "--plugin", str(tmp_path / "myderpp.py")]) == 0
    out = capsys.readouterr().out
    assert f"### `myderpp` (from --plugin {tmp_path / 'myderpp.py'})" in out
    assert "| `method.alpha` | float | `0.3` | weight of the logit replay |" in out
