"""Comparison figures (`cfl report --plots`, `cfl sweep`): every PNG with its CSV, CSV values checked by hand."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from cfl.app.cli import main

#: the figures of cfl/report/compare_plots.py, each written as NAME.png with NAME.csv
FIGURES = ("acc_fgt", "acc_vs_fgt", "accuracy_curves", "acc_matrices")


def write_run(path: Path, method: dict[str, Any], seed: int, acc: float, fgt: float,
              matrix: list[list[float | None]], curve: dict[int, float]) -> None:
    """A finished 2-task run (1 round per task): results.json and metrics.jsonl with ``curve`` as mean_acc."""
    path.mkdir(parents=True)
    config = {"seed": seed, "lr": 0.05, "rounds_per_task": 1, "method": method}
    (path / "results.json").write_text(json.dumps({
        "stream": "split-digits", "partition": "iid", "method": method["name"], "seed": seed, "num_tasks": 2,
        "complete": True, "acc": acc, "fgt": fgt, "acc_matrix": matrix, "config": config}))
    lines = [{"kind": "round", "round": 1, "mean_acc": 99.0}]  # round lines carry no evaluation
    lines += [{"kind": "evaluation", "round": r, "task": r - 1, "acc": {"0": v}, "mean_acc": v}
              for r, v in curve.items()]
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fedavg seeds 0, 1: ACC 80, 84, FGT 2, 4; fedprox seeds 0, 1: ACC 70, 76, FGT 1, 1."""
    root = tmp_path_factory.mktemp("compare") / "runs"
    fedavg, fedprox = {"name": "fedavg"}, {"name": "fedprox", "mu": 0.01}
    write_run(root / "a0", fedavg, 0, 80.0, 2.0, [[90.0, None], [80.0, 70.0]], {1: 50.0, 2: 60.0})
    write_run(root / "a1", fedavg, 1, 84.0, 4.0, [[94.0, None], [84.0, 74.0]], {1: 54.0, 2: 70.0, 3: 75.0})
    write_run(root / "p0", fedprox, 0, 70.0, 1.0, [[60.0, None], [50.0, 40.0]], {1: 30.0, 2: 40.0})
    write_run(root / "p1", fedprox, 1, 76.0, 1.0, [[60.0, None], [50.0, 40.0]], {1: 30.0, 2: 40.0})
    return root


@pytest.fixture(scope="module")
def figures(runs: Path) -> Path:
    """``cfl report RUNS --plots DIR`` once for the tests that read its CSVs."""
    out = runs.parent / "figures"
    assert main(["report", str(runs), "--plots", str(out)]) == 0
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def by_method(rows: list[dict[str, str]], method: str) -> list[dict[str, float]]:
    return [{k: float(v) for k, v in r.items() if k not in ("group", "stream", "partition", "method", "seeds")}
            for r in rows if r["group"].split()[0] == method]


def test_report_plots_writes_every_png_and_csv(runs: Path, tmp_path: Path, capsys):
    out = tmp_path / "figures" / "new"
    assert main(["report", str(runs), "--plots", str(out)]) == 0
    for name in FIGURES:
        assert (out / f"{name}.png").stat().st_size > 1000, name
        assert (out / f"{name}.csv").is_file(), name
    printed = capsys.readouterr().out
    assert "| fedavg" in printed and f"figures: {out}/" in printed


def test_acc_and_fgt_csv_are_the_means_and_sample_stds_over_seeds(figures: Path):
    for name in ("acc_fgt.csv", "acc_vs_fgt.csv"):
        rows = read_csv(figures / name)
        [fedavg], [fedprox] = by_method(rows, "fedavg"), by_method(rows, "fedprox")
        # ACC 80, 84: mean 82, sample std sqrt((4 + 4) / 1); FGT 2, 4: 3 ± sqrt(2)
        assert fedavg["acc_mean"] == pytest.approx(82) and fedavg["acc_std"] == pytest.approx(math.sqrt(8))
        assert fedavg["fgt_mean"] == pytest.approx(3) and fedavg["fgt_std"] == pytest.approx(math.sqrt(2))
        # ACC 70, 76: 73 ± sqrt(18); FGT 1, 1: 1 ± 0
        assert fedprox["acc_mean"] == pytest.approx(73) and fedprox["acc_std"] == pytest.approx(math.sqrt(18))
        assert (fedprox["fgt_mean"], fedprox["fgt_std"], fedprox["runs"]) == (1, 0, 2)
        assert [r["seeds"] for r in rows] == ["0 1", "0 1"]


def test_curve_csv_is_mean_min_max_over_seeds_at_rounds_every_seed_evaluated(figures: Path):
    fedavg = by_method(read_csv(figures / "accuracy_curves.csv"), "fedavg")
    # round 1: 50, 54; round 2: 60, 70; round 3 only in seed 1 (left out); round lines' mean_acc ignored
    assert fedavg == [{"round": 1, "mean": 52, "min": 50, "max": 54, "runs": 2},
                      {"round": 2, "mean": 65, "min": 60, "max": 70, "runs": 2}]


def test_matrix_csv_is_the_cell_mean_over_seeds(figures: Path):
    fedavg = by_method(read_csv(figures / "acc_matrices.csv"), "fedavg")
    cells = {(int(r["after_task"]), int(r["evaluated_task"])): (r["mean"], r["std"]) for r in fedavg}
    # tasks from 0, as in results.json: a[0][0] 90, 94; a[1][0] 80, 84; a[1][1] 70, 74: each mean +2, std sqrt(8);
    # a[0][1] never evaluated
    assert cells == {(0, 0): (92, pytest.approx(math.sqrt(8))), (1, 0): (82, pytest.approx(math.sqrt(8))),
                     (1, 1): (72, pytest.approx(math.sqrt(8)))}


def test_a_plots_path_that_is_a_file_is_refused_before_any_work(runs: Path, tmp_path: Path, capsys):
    target = tmp_path / "taken"
    target.write_text("x")
    assert main(["report", str(runs), "--plots", str(target)]) == 2
    captured = capsys.readouterr()
    assert "--plots" in captured.err and captured.out == "" and target.read_text() == "x"


def test_sweep_writes_the_figures_of_its_grid(tmp_path: Path, capsys):
    base = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
            "rounds_per_task": 1, "batch_size": 32, "wandb": {"mode": "disabled"}}
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": base, "out": str(tmp_path / "runs"),
                                     "grid": {"method.name": ["fedavg", "fedprox"], "seed": [0, 1]}}))
    assert main(["sweep", str(sweep)]) == 0
    rows = read_csv(tmp_path / "runs" / "acc_fgt.csv")
    assert [(r["method"], r["seeds"], r["runs"]) for r in rows] == [("fedavg", "0 1", "2"), ("fedprox", "0 1", "2")]
    for name in FIGURES:
        assert (tmp_path / "runs" / f"{name}.png").is_file(), name
    assert f"figures: {tmp_path / 'runs'}/" in capsys.readouterr().out
