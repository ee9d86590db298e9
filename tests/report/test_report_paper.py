"""Tables and figures a paper takes as they are: bold only results, a methods x settings
LaTeX layout that compiles, a paired test against a reference row (hand-computed), ACC over the last k
evaluations, figures faceted by setting with one colour and marker per method, no title by default."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.colors import to_rgb

from cfl.app.cli import main
from cfl.report.significance import paired_p
from cfl.report.table import TableOptions, report
from tests.report import test_plots
from tests.report.test_plots_compare import write_run
from tests.report.test_report import rows, write_results
from tests.report.test_report_latex import assert_latex_structure, split_cells

saved_figures = test_plots.saved_figures

#: ACC over 4 seeds: FedAvg 70, 72, 74, 76; EWC 71, 74, 75, 79 (differences 1, 2, 1, 3); FedProx = FedAvg + 0
FEDAVG, EWC = [70.0, 72.0, 74.0, 76.0], [71.0, 74.0, 75.0, 79.0]


def t_test_by_hand() -> float:
    """Two-sided p of the paired t-test on EWC - FedAvg: mean 1.75, sample std sqrt(2.75 / 3), t = mean / (std / 2)
    with 3 degrees of freedom, whose CDF is 1/2 + (theta + sin theta cos theta) / pi, theta = atan(t / sqrt 3)."""
    t = 1.75 / (math.sqrt(2.75 / 3) / 2)
    theta = math.atan(t / math.sqrt(3))
    return 1 - 2 / math.pi * (theta + math.sin(theta) * math.cos(theta))


def four_seeds(root: Path, partition: str = "iid", upload: bool = False) -> Path:
    for name, accs in (("fedavg", FEDAVG), ("ewc", EWC), ("fedprox", FEDAVG)):
        for seed, acc in enumerate(accs):
            extra = {"upload_bytes": (2 if name == "ewc" else 1) * 2 ** 30} if upload else {}
            write_results(root / f"{partition}-{name}-{seed}", seed, acc, 10.0 - seed, method=name,
                          partition=partition, config={"method": {"name": name}, "partition": {"name": partition}},
                          **extra)
    return root


def test_paired_t_test_on_four_seeds_matches_the_hand_computed_p():
    assert t_test_by_hand() == pytest.approx(0.0353528, abs=1e-6)
    found = paired_p(dict(enumerate(FEDAVG)), dict(enumerate(EWC)), "t")
    assert found.n == 4 and found.p == pytest.approx(t_test_by_hand(), rel=1e-9) and found.marked
    assert paired_p(dict(enumerate(FEDAVG)), dict(enumerate(FEDAVG)), "t").p == 1.0  # identical: nothing differs
    assert paired_p({0: 1.0}, {0: 2.0}, "t").p is None  # one pair: no test
    assert paired_p(dict(enumerate(FEDAVG)), dict(enumerate(EWC)), "wilcoxon").p is None  # 4 < 6 pairs
    assert paired_p({0: 70.0, 1: 72.0, 5: 1.0}, {0: 71.0, 1: 74.0, 7: 9.0}, "t").n == 2  # paired by seed


def test_the_table_marks_rows_that_differ_from_fedavg_and_the_csv_holds_the_p_values(tmp_path):
    four_seeds(tmp_path)
    table = report([tmp_path], options=TableOptions(columns=("method", "acc", "fgt")))
    lines = table.splitlines()
    assert lines[-1].startswith("† differs from the fedavg row")
    assert "paired t-test (scipy.stats.ttest_rel)" in lines[-1]
    found = rows("\n".join(lines[:-2]))
    assert [(r["method"], r["ACC (%)"]) for r in found] == [
        ("fedavg", "73.00 ± 2.58"), ("ewc", "74.75 ± 3.30 †"), ("fedprox", "73.00 ± 2.58")]
    assert found[1]["FGT (%)"] == "8.50 ± 1.29"  # FGT alike in every row: p = 1, no dagger
    data = list(csv.DictReader(io.StringIO(report([tmp_path], "csv", TableOptions(columns=("method", "acc"))))))
    assert [(r["method"], r["significance"]) for r in data] == [
        ("fedavg", "reference"), ("ewc", "paired t-test (scipy.stats.ttest_rel) against fedavg, 4 seeds paired"),
        ("fedprox", "paired t-test (scipy.stats.ttest_rel) against fedavg, 4 seeds paired")]
    assert data[0]["ACC (%) p"] == "" and float(data[1]["ACC (%) p"]) == pytest.approx(t_test_by_hand())
    assert float(data[2]["ACC (%) p"]) == 1.0


def test_a_chosen_reference_and_one_that_matches_no_row(tmp_path, capsys):
    four_seeds(tmp_path)
    data = list(csv.DictReader(io.StringIO(report([tmp_path], "csv", TableOptions(columns=("method", "acc"),
                                                                                  reference="ewc")))))
    assert [r["significance"] for r in data][1] == "reference"
    assert float(data[0]["ACC (%) p"]) == pytest.approx(t_test_by_hand())
    assert main(["report", str(tmp_path), "--reference", "nosuch"]) == 2
    captured = capsys.readouterr()
    assert "--reference 'nosuch' matches no row" in captured.err and captured.out == ""


def test_costs_are_never_bold_and_the_latex_note_names_the_test(tmp_path):
    four_seeds(tmp_path, upload=True)
    text = report([tmp_path], "latex", TableOptions(columns=("method", "acc", "upload")))
    header, body = assert_latex_structure(text.split(r"\par")[0].strip(), columns=3, rows=3)
    # ACC: EWC best and different from FedAvg at p = 0.035; upload: FedAvg's 1 GiB is lowest, yet a cost: no bold
    assert body == [["FedAvg", r"73.00 $\pm$ 2.58", r"1.000 $\pm$ 0.000"],
                    ["EWC+FL", r"\textbf{74.75 $\pm$ 3.30}$^\dagger$", r"2.000 $\pm$ 0.000"],
                    ["FedProx", r"73.00 $\pm$ 2.58", r"1.000 $\pm$ 0.000"]]
    assert r"$^\dagger$ differs from the fedavg row" in text and "paired t-test" in text


def settings_table(root: Path) -> Path:
    """IID and Dirichlet: FedAvg, EWC and FedProx on both, a long-labelled FedProx on Dirichlet only."""
    four_seeds(root, "iid")
    four_seeds(root, "dirichlet")
    write_results(root / "long", 0, 50.0, 1.0, method="fedprox", partition="dirichlet",
                  config={"method": {"name": "fedprox"}, "partition": {"name": "dirichlet"},
                          "label": "FedProx with a label too long for one line"})
    return root


def test_methods_x_settings_layout_a_multicolumn_per_setting(tmp_path):
    settings_table(tmp_path)
    text = report([tmp_path], "latex", TableOptions(columns=("method", "acc", "fgt"), layout="methods-x-settings",
                                                    width=r"\linewidth"))
    lines = text.splitlines()
    assert lines[0] == r"\resizebox{\linewidth}{!}{%" and lines[1] == r"\begin{tabular}{lrrrr}"
    assert lines[3] == r"method & \multicolumn{2}{c}{dirichlet} & \multicolumn{2}{c}{iid} \\"
    assert lines[4] == r"\cmidrule(lr){2-3} \cmidrule(lr){4-5}"
    assert split_cells(lines[5])[1:] == [r"ACC (\%) $\uparrow$", r"FGT (\%) $\downarrow$"] * 2
    body = [split_cells(line) for line in lines[7:lines.index(r"\bottomrule")]]
    assert [r[0] for r in body][:3] == ["FedAvg", "EWC+FL", "FedProx"]  # FedAvg first, one row per method
    assert body[1][1] == r"\textbf{74.75 $\pm$ 3.30}$^\dagger$" and body[1][3] == body[1][1]  # best in both settings
    long = body[3]  # a long label wrapped; a cell it has no run for: --
    assert long[0].startswith(r"\shortstack[l]{FedProx") and long[3:] == ["--", "--"]
    assert long[1] == "50.00"


def test_methods_x_settings_refuses_columns_it_has_no_place_for(tmp_path, capsys):
    settings_table(tmp_path)
    assert main(["report", str(tmp_path), "--format", "latex", "--layout", "methods-x-settings", "--columns",
                 "method,seeds,acc"]) == 2
    assert "seeds has no place" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--layout", "methods-x-settings"]) == 2  # Markdown: no layout
    assert "--layout" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex is not installed (Debian: apt-get install texlive-latex-base "
                           "texlive-latex-recommended); the structural tests above still run")
def test_the_methods_x_settings_table_compiles(tmp_path):
    settings_table(tmp_path / "runs")
    table = report([tmp_path / "runs"], "latex", TableOptions(layout="methods-x-settings", width=r"\linewidth",
                                                               caption="Two partitions.", label="tab:two"))
    (tmp_path / "table.tex").write_text(table)
    (tmp_path / "paper.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage{graphicx}\n"
                                        "\\begin{document}\n\\input{table}\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    warnings = [line for line in done.stdout.splitlines() if "Warning" in line and "Rerun to get" not in line]
    assert (tmp_path / "paper.pdf").stat().st_size > 0 and not warnings, done.stdout[-3000:]


def metrics_run(path: Path, method: str, seed: int, partition: str, curve: dict[int, float]) -> None:
    write_run(path, {"name": method}, seed, 80.0 + seed, 2.0, [[90.0, None], [80.0, 70.0]], curve)
    results = json.loads((path / "results.json").read_text())
    (path / "results.json").write_text(json.dumps({**results, "partition": partition}))


def test_last_k_averages_each_runs_last_evaluations_in_tables_and_curves(tmp_path):
    metrics_run(tmp_path / "runs" / "a0", "fedavg", 0, "iid", {1: 50.0, 2: 60.0, 3: 90.0})
    metrics_run(tmp_path / "runs" / "a1", "fedavg", 1, "iid", {1: 40.0, 2: 70.0, 3: 80.0})
    table = report([tmp_path / "runs"], options=TableOptions(columns=("method", "acc"), last_k=2))
    assert rows(table) == [{"method": "fedavg", "ACC last 2 (%)": "75.00 ± 0.00"}]  # (60 + 90) / 2, (70 + 80) / 2
    assert main(["report", str(tmp_path / "runs"), "--plots", str(tmp_path / "fig"), "--last-k", "2"]) == 0
    curve = list(csv.DictReader((tmp_path / "fig" / "accuracy_curves.csv").open()))
    # seed 0: 50, 55, 75; seed 1: 40, 55, 75
    assert [(float(r["mean"]), float(r["min"]), float(r["max"])) for r in curve] == [
        (45.0, 40.0, 50.0), (55.0, 55.0, 55.0), (75.0, 75.0, 75.0)]
    assert "averaged over its last 2 evaluations" in (tmp_path / "fig" / "accuracy_curves.txt").read_text()
    assert main(["report", str(tmp_path / "runs"), "--last-k", "0"]) == 2


def two_partitions(root: Path) -> Path:
    """FedProx and FedAvg on IID, LwF and FedAvg on Dirichlet, 2 seeds each."""
    for partition, methods in (("iid", ("fedprox", "fedavg")), ("dirichlet", ("fedlwf", "fedavg"))):
        for method in methods:
            for seed in (0, 1):
                metrics_run(root / f"{partition}-{method}-{seed}", method, seed, partition, {1: 50.0, 2: 60.0})
    return root


def test_figures_have_a_panel_per_partition_and_one_look_per_method(tmp_path, saved_figures):
    assert main(["report", str(two_partitions(tmp_path / "runs")), "--plots", str(tmp_path / "fig")]) == 0
    curves = saved_figures["accuracy_curves.png"]
    axes = [ax for ax in curves.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["dirichlet", "iid"]  # a panel per partition, titled by it
    colour = {}
    for ax in axes:
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                assert colour.setdefault(line.get_label(), (to_rgb(line.get_color()), line.get_marker())) == (
                    to_rgb(line.get_color()), line.get_marker()), line.get_label()  # the same in both panels
    assert set(colour) == {"FedAvg", "FedProx", "FedLwF"} and len(set(colour.values())) == 3
    legend = [t.get_text() for t in curves.legends[0].get_texts()]
    assert legend == ["FedAvg", "FedLwF", "FedProx"]  # the table's row order: FedAvg first
    for name in ("accuracy_curves.png", "acc_fgt.png", "acc_vs_fgt.png", "acc_matrices.png"):
        assert saved_figures[name]._suptitle is None, name  # noqa: SLF001 - no caption-like title by default
    assert "dirichlet / iid" in (tmp_path / "fig" / "accuracy_curves.txt").read_text()
    assert main(["report", str(tmp_path / "runs"), "--plots", str(tmp_path / "one"), "--facet", "none",
                 "--title", "My title"]) == 0
    one = saved_figures["accuracy_curves.png"]
    assert len([ax for ax in one.axes if ax.get_visible()]) == 1 and one._suptitle.get_text() == "My title"  # noqa: SLF001
    assert "dirichlet FedAvg" in [t.get_text() for t in one.legends[0].get_texts()]
