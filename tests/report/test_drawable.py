"""Labels and sizes matplotlib cannot draw are refused before any work; a figure that fails anyway costs a run
its figure only, never its results; report options and results that would be used silently are refused
(cfl/drawable.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

import cfl.report.plots
from cfl.app.cli import main
from cfl.app.single_run import execute
from tests.conftest import tiny_config
from tests.report.test_plots_compare import write_run

BROKEN = r"$\sqrt{2$"
BASE = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 1, "batch_size": 16, "wandb": {"mode": "disabled"}}


def config_file(tmp_path: Path, **extra: object) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra}))
    return str(path)


def two_runs(root: Path, label: str | None = None, matrix: list | None = None) -> Path:
    for seed in (0, 1):
        write_run(root / f"s{seed}", {"name": "fedavg"}, seed, 80.0 + seed, 2.0,
                  matrix or [[90.0, None], [80.0, 70.0]], {1: 50.0, 2: 60.0})
        if label is not None:
            path = root / f"s{seed}" / "results.json"
            results = json.loads(path.read_text())
            results["config"]["label"] = label
            path.write_text(json.dumps(results))
    return root


@pytest.mark.parametrize(("label", "words"), [
    (BROKEN, ["'label'", "mathtext", r"\$"]),
    ("EWC\n\nlam 100", ["'label'", "line break"]),
])
def test_a_label_matplotlib_or_latex_cannot_take_is_refused_before_any_work(label, words, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", config_file(tmp_path, label=label), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert not out.exists()


def test_labels_matplotlib_draws_pass() -> None:
    from cfl.drawable import check_label

    for label in ("FedAvg", r"EWC $\lambda=10^3$", "costs $5", r"\$5 and $x$", r"$\alpha$ vs $\beta$"):
        check_label(label, "'label'")


def test_a_style_label_with_broken_mathtext_is_refused_before_any_output(tmp_path, capsys):
    style = tmp_path / "style.yaml"
    style.write_text(yaml.safe_dump({"groups": [{"group": "fedavg", "label": BROKEN}]}))
    fig = tmp_path / "fig"
    code = main(["report", str(two_runs(tmp_path / "runs")), "--plots", str(fig), "--plot-style", str(style)])
    captured = capsys.readouterr()
    assert code == 2 and "the label of group 'fedavg'" in captured.err and "mathtext" in captured.err, captured.err
    assert captured.out == "" and not any(fig.glob("*"))  # not even the table


@pytest.mark.parametrize("size", [["100000", "100000"], ["0.001", "3"]])
def test_a_figure_size_matplotlib_cannot_draw_is_refused_before_any_output(size, tmp_path, capsys):
    fig = tmp_path / "fig"
    code = main(["report", str(two_runs(tmp_path / "runs")), "--plots", str(fig), "--figure-size", *size])
    captured = capsys.readouterr()
    assert code == 2 and "--figure-size" in captured.err and "1 to 100 inches" in captured.err, captured.err
    assert captured.out == "" and not any(fig.glob("*"))


def test_a_figure_that_fails_costs_the_run_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    seen: list[bool] = []
    original = cfl.report.plots.plot_curve

    def curve(*args, **kwargs):
        seen.append((out / "results.json").is_file())  # results.json is written before any figure
        return original(*args, **kwargs)

    def matrix(*_args: object, **_kwargs: object) -> None:
        raise ValueError("Image size of 12000000x12000000 pixels is too large")

    monkeypatch.setattr(cfl.report.plots, "plot_curve", curve)
    monkeypatch.setattr(cfl.report.plots, "plot_matrix", matrix)
    results = execute(tiny_config(rounds_per_task=1), out, quiet=True)
    err = capsys.readouterr().err
    assert seen == [True]
    assert json.loads((out / "results.json").read_text())["acc"] == results["acc"]
    assert "figure acc_matrix.png not written: ValueError: Image size" in err, err
    assert not (out / "acc_matrix.png").exists()
    assert (out / "accuracy_curve.png").is_file() and (out / "task_accuracy.png").is_file()


def test_a_report_figure_that_fails_is_named_and_the_others_written_exit_1(tmp_path, capsys):
    """A label from a results.json of an older cfl, which did not check labels."""
    fig = tmp_path / "fig"
    code = main(["report", str(two_runs(tmp_path / "runs", label=BROKEN)), "--plots", str(fig)])
    captured = capsys.readouterr()
    assert code == 1
    assert "figure acc_fgt.png not written" in captured.err and "could not be drawn" in captured.err, captured.err
    assert BROKEN in captured.out  # the table is printed
    assert {p.name for p in fig.glob("*.csv")} == {"acc_fgt.csv", "acc_vs_fgt.csv", "accuracy_curves.csv",
                                                   "acc_matrices.csv"}


def test_a_column_named_twice_is_refused(tmp_path, capsys):
    assert main(["report", str(two_runs(tmp_path / "runs")), "--columns", "acc,acc"]) == 2
    captured = capsys.readouterr()
    assert "'acc' more than once" in captured.err and captured.out == ""


def test_an_accuracy_matrix_holding_nan_is_left_out_naming_the_run(tmp_path, capsys):
    root = two_runs(tmp_path / "runs")
    write_run(root / "nan", {"name": "fedavg"}, 2, 90.0, 2.0, [[math.nan, None], [80.0, 70.0]], {1: 50.0})
    assert main(["report", str(root), "--format", "csv", "--columns", "method,runs,seeds"]) == 0
    captured = capsys.readouterr()
    assert f"skipped {root / 'nan' / 'results.json'}: 'acc_matrix' holds nan at row 0, column 0" in captured.err
    assert captured.out.splitlines()[1] == "fedavg,2,\"0,1\""
