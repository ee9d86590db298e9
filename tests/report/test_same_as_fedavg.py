"""`cfl report` marks a row whose accuracy matrices equal FedAvg's under the same settings."""

import csv
import io

from cfl.app.cli import main
from tests.report.test_report import rows, write_results

SAME = [[90.0, None], [40.0, 80.0]]
OTHER = [[90.0, None], [55.0, 79.0]]


def write(tmp_path, name, method, matrix, seed=0, lr=0.05, **spec):
    write_results(tmp_path / f"{name}{seed}", seed, 60.0, 40.0, method=method, acc_matrix=matrix,
                  config={"lr": lr, "method": {"name": method, **spec}})


def test_a_row_with_fedavgs_matrices_under_the_same_settings_is_marked_with_a_footnote(tmp_path, capsys):
    for seed in (0, 1):
        write(tmp_path, "fedavg", "fedavg", SAME, seed)
        write(tmp_path, "ewc", "ewc", SAME, seed)  # EWC at its defaults: FedAvg's matrices digit for digit
        write(tmp_path, "prox", "fedprox", OTHER if seed else SAME, seed, mu=1.0)  # one seed differs
    write(tmp_path, "ewc-lr", "ewc", SAME, 0, lr=0.1)  # no FedAvg at lr 0.1 to compare with
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    labels = [r["method"] for r in rows(out.split("\n\n")[0])]
    assert labels == ["fedavg lr=0.05", "ewc lr=0.05 [=FedAvg]", "ewc lr=0.1", "fedprox lr=0.05 method.mu=1.0"]
    notes = out.strip().split("\n\n")[1:]  # under the table: the significance note, then this one
    assert notes[-1].startswith("[=FedAvg]: the accuracy matrices equal FedAvg's digit for digit under "
                                "the same settings (the same config but the method; seed(s) 0, 1)")


def test_csv_stays_one_table_and_latex_compiles_with_the_note_as_a_comment(tmp_path, capsys):
    write(tmp_path, "fedavg", "fedavg", SAME)
    write(tmp_path, "ewc", "ewc", SAME)
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    parsed = list(csv.DictReader(io.StringIO(captured.out)))
    assert [r["method"] for r in parsed] == ["fedavg", "ewc [=FedAvg]"]
    assert "cfl: note: [=FedAvg]: the accuracy matrices equal" in captured.err
    assert main(["report", str(tmp_path), "--format", "latex"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("% [=FedAvg]: the accuracy matrices equal"), last


def test_no_mark_without_a_fedavg_row_or_with_other_matrices(tmp_path, capsys):
    write(tmp_path, "ewc", "ewc", SAME)
    write(tmp_path, "prox", "fedprox", SAME)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[=FedAvg]" not in out
