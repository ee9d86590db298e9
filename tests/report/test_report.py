"""`cfl report`: rows are configs less seed (labels say what differs), mean ± sample std checked by hand per
column, CSV and LaTeX that parse, damaged or incomplete results skipped with a warning, duplicates counted once."""

import csv
import io
import json

import pytest

from cfl.app.cli import main
from cfl.report.groups import group_runs, load_runs
from cfl.report.table import COLUMN_KEYS, TableOptions, report

GIB = 1024 ** 3


def write_results(path, seed, acc, fgt, config=None, **extra):
    path.mkdir(parents=True)
    body = {"stream": "split-digits", "partition": "iid", "method": "fedavg", "seed": seed, "acc": acc,
            "fgt": fgt, "complete": True, "config": {"seed": seed, "lr": 0.05, **(config or {})}, **extra}
    (path / "results.json").write_text(json.dumps(body))


def rows(table: str) -> list[dict[str, str]]:
    """The Markdown table as one dict (column title -> cell) per row."""
    lines = table.splitlines()
    assert lines[1].startswith("|---"), table
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], r, strict=True)) for r in cells[2:]]


def row(table: str) -> dict[str, str]:
    found = rows(table)
    assert len(found) == 1, table
    return found[0]


def test_runs_that_differ_in_lr_are_two_rows_labelled_by_lr(tmp_path):
    for seed in (0, 1):
        write_results(tmp_path / f"a{seed}", seed, 60.0 + seed, 1.0, config={"lr": 0.05})
        write_results(tmp_path / f"b{seed}", seed, 80.0 + seed, 1.0, config={"lr": 0.5})
    found = rows(report([tmp_path]))
    assert [(r["method"], r["seeds"], r["ACC (%)"]) for r in found] == [
        ("fedavg lr=0.05", "0,1", "60.50 ± 0.71"), ("fedavg lr=0.5", "0,1", "80.50 ± 0.71")]


def test_result_neutral_keys_do_not_split_but_device_does(tmp_path):
    neutral = [{"threads": 1, "wandb": {"mode": "offline"}, "checkpoint_every": 10, "data_root": "/a"},
               {"threads": 4, "wandb": {"mode": "disabled", "tags": ["x"]}, "checkpoint_every": 0, "data_root": None}]
    for seed, keys in enumerate(neutral):
        write_results(tmp_path / f"s{seed}", seed, 70.0, 1.0, config={"device": "cpu", **keys})
    write_results(tmp_path / "gpu", 0, 70.0, 1.0, config={"device": "cuda"})
    found = rows(report([tmp_path]))
    assert [(r["method"], r["runs"], r["seeds"]) for r in found] == [("fedavg device=cpu", "2", "0,1"),
                                                                    ("fedavg device=cuda", "1", "0")]


def test_labels_tell_apart_the_rows_of_one_stream_and_partition_only(tmp_path):
    for lr, clients in ((10, 5), (2, 5), (10, 7)):
        write_results(tmp_path / f"split-{lr}-{clients}", 0, 70.0, 1.0, config={"lr": lr, "num_clients": clients})
    write_results(tmp_path / "permuted", 0, 70.0, 1.0, stream="permuted-digits", config={"num_clients": 99})
    write_results(tmp_path / "permuted1", 1, 70.0, 1.0, stream="permuted-digits", config={"num_clients": 99})
    found = rows(report([tmp_path]))
    assert [(r["stream"], r["method"], r["runs"]) for r in found] == [
        ("permuted-digits", "fedavg", "2"), ("split-digits", "fedavg lr=2 num_clients=5", "1"),
        ("split-digits", "fedavg lr=10 num_clients=5", "1"), ("split-digits", "fedavg lr=10 num_clients=7", "1")]


# ---- a config and a seed count once ----
def test_the_same_runs_in_two_sweeps_count_once_per_seed(tmp_path, capsys):
    """Two sweeps that both hold seeds 0 and 1 of one config: n = 2 (it was 4, with a std shrunk to 0.61)."""
    for sweep in ("sweep-a", "sweep-b"):
        write_results(tmp_path / sweep / "s0", 0, 70.0, 1.0, acc_matrix=[[70.0]], wall_seconds=10.0 + len(sweep))
        write_results(tmp_path / sweep / "s1", 1, 71.5, 2.0, acc_matrix=[[71.5]], wall_seconds=20.0)
    r = row(report([tmp_path]))
    assert (r["runs"], r["seeds"], r["ACC (%)"], r["FGT (%)"]) == ("2", "0,1", "70.75 ± 1.06", "1.50 ± 0.71")
    err = capsys.readouterr().err
    for seed in (0, 1):
        assert (f"split-digits iid fedavg: seed {seed} has 2 runs of the same config with the same results "
                f"({tmp_path}/sweep-a/s{seed}, {tmp_path}/sweep-b/s{seed}); counted once "
                f"(kept {tmp_path}/sweep-a/s{seed})") in err, err
    figures = [len(g.runs) for g in group_runs(load_runs([tmp_path]))]  # the comparison figures' groups too
    assert figures == [2]


def test_runs_of_one_config_and_seed_with_different_results_are_refused(tmp_path, capsys):
    write_results(tmp_path / "a" / "s0", 0, 70.0, 1.0, acc_matrix=[[70.0]])
    write_results(tmp_path / "b" / "s0", 0, 70.0, 1.0, acc_matrix=[[70.5]])
    assert main(["report", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert ("split-digits iid fedavg: seed 0 has 2 runs of the same config whose results differ (acc_matrix): "
            f"{tmp_path}/a/s0, {tmp_path}/b/s0") in err and "remove the others or report their directories" in err


def test_markdown_escapes_a_bar_in_a_label(tmp_path):
    for note in ("a|b", "c"):
        write_results(tmp_path / note.replace("|", ""), 0, 70.0, 1.0, config={"method": {"name": "x", "note": note}})
    assert [r["method"] for r in rows(report([tmp_path]).replace("\\|", "/"))] == ["fedavg method.note=a/b",
                                                                                  "fedavg method.note=c"]


def test_labels_name_parameters_that_differ_within_a_method_not_those_of_other_methods(tmp_path):
    write_results(tmp_path / "avg", 0, 70.0, 1.0, config={"method": {"name": "fedavg"}, "plugins": []})
    for lam, mu in ((10, 0.01), (100, 0.01), (100, 0.1)):
        write_results(tmp_path / f"ewc-{lam}-{mu}", 0, 70.0, 1.0, method="ewc+fedprox",
                      config={"method": {"name": "ewc", "lam": lam, "gamma": 1.0},
                              "plugins": [{"name": "fedprox", "mu": mu}]})
    labels = [g.label for g in group_runs(load_runs([tmp_path]))]
    assert labels == ["ewc+fedprox method.lam=10 plugins.0.mu=0.01", "ewc+fedprox method.lam=100 plugins.0.mu=0.01",
                      "ewc+fedprox method.lam=100 plugins.0.mu=0.1", "fedavg"]


def test_a_key_only_some_runs_have_is_named_when_nothing_else_tells_them_apart(tmp_path):
    write_results(tmp_path / "old", 0, 70.0, 1.0)  # from before `momentum` existed
    write_results(tmp_path / "new", 0, 70.0, 1.0, config={"momentum": 0.9})
    assert [g.label for g in group_runs(load_runs([tmp_path]))] == ["fedavg", "fedavg momentum=0.9"]


def test_every_column_by_hand(tmp_path):
    # ACC 70, 80, 90: mean 80, sample std sqrt((100 + 0 + 100) / 2) = 10 (population std would be 8.16)
    # FGT 1, 2, 6: mean 3, sample std sqrt((4 + 1 + 9) / 2) = sqrt(7) = 2.6458 (population: 2.16)
    # BWT -1, -2, -6: -3 ± 2.65. Upload 1, 2, 3 GiB: 2 ± 1. Wall 10, 20, 60 s: 30 ± sqrt((400+100+900)/2) = 26.5
    # Rounds to 50%: per run the mean over its tasks: (2+4)/2 = 3, (1+3)/2 = 2, (5+5)/2 = 5 -> 3.33 ± 1.53.
    # Rounds to 90%: the third run never reached it on task 1, so over two runs: (4+6)/2 = 5, 3 -> 4.0 ± 1.4.
    reached = [{"0": {"50": 2, "90": 4}, "1": {"50": 4, "90": 6}}, {"0": {"50": 1, "90": 3}, "1": {"50": 3, "90": 3}},
               {"0": {"50": 5, "90": 8}, "1": {"50": 5, "90": None}}]
    # AIA 75, 85, 95 (= ACC + 5): 85 ± 10. FWT 1, 2, 6 (= FGT): 3 ± 2.65.
    # Class 0: 60, 70, 80 -> 70 ± 10; class 10 only in the first run: 50 (1 of 3 runs).
    # Client means (schedule): ACC 60, 70, 80 -> 70 ± 10; FGT 2, 3, 7 -> 4 ± 2.65. Rounds 10, 12, 20: 14 ± 5.29.
    for seed, (acc, fgt, wall) in enumerate([(70.0, 1.0, 10.0), (80.0, 2.0, 20.0), (90.0, 6.0, 60.0)]):
        write_results(tmp_path / f"s{seed}", seed, acc, fgt, bwt=-fgt, upload_bytes=(seed + 1) * GIB,
                      wall_seconds=wall, rounds_to_target=reached[seed], aia=acc + 5, fwt=fgt,
                      class_acc={"0": acc - 10, **({"10": 50.0} if seed == 0 else {})}, rounds=(10, 12, 20)[seed],
                      schedule={"name": "staggered", "client_acc_mean": acc - 10, "client_fgt_mean": fgt + 1})
    assert row(report([tmp_path], options=TableOptions(columns=COLUMN_KEYS))) == {
        "stream": "split-digits", "partition": "iid", "method": "fedavg", "runs": "3", "seeds": "0,1,2",
        "ACC (%)": "80.00 ± 10.00", "FGT (%)": "3.00 ± 2.65", "BWT (%)": "-3.00 ± 2.65",
        "AIA (%)": "85.00 ± 10.00", "FWT (%)": "3.00 ± 2.65",
        "client ACC (%)": "70.00 ± 10.00", "client FGT (%)": "4.00 ± 2.65",
        "rounds to 50%": "3.3 ± 1.5", "rounds to 90%": "4.0 ± 1.4 (2 of 3 runs)",
        "class 0 (%)": "70.00 ± 10.00", "class 10 (%)": "50.00 (1 of 3 runs)", "rounds": "14 ± 5",
        "upload (GiB)": "2.000 ± 1.000", "wall (s)": "30.0 ± 26.5"}


def test_the_default_columns_leave_out_bwt_and_classes_and_show_aia_and_fwt_when_measured(tmp_path):
    write_results(tmp_path / "old", 0, 70.0, 1.0, bwt=-1.0, config={"lr": 0.5})  # from before AIA and FWT
    assert list(row(report([tmp_path]))) == ["stream", "partition", "method", "runs", "seeds", "ACC (%)", "FGT (%)",
                                             "upload (GiB)", "wall (s)"]
    write_results(tmp_path / "new", 0, 70.0, 1.0, bwt=-1.0, aia=72.0, fwt=None, class_acc={"0": 70.0})
    assert [r["AIA (%)"] for r in rows(report([tmp_path]))] == ["72.00", "–"]  # FWT null in both: no column
    assert "FWT (%)" not in rows(report([tmp_path]))[0]
    chosen = TableOptions(columns=("method", "fwt", "bwt", "class_acc"))
    assert rows(report([tmp_path], options=chosen)) == [
        {"method": "fedavg lr=0.05", "FWT (%)": "–", "BWT (%)": "-1.00", "class 0 (%)": "70.00"},
        {"method": "fedavg lr=0.5", "FWT (%)": "–", "BWT (%)": "-1.00", "class 0 (%)": "–"}]


def test_the_client_means_are_shown_by_default_when_a_run_is_under_a_schedule(tmp_path):
    """A synchronous run's results.json has no ``schedule``: its cells are empty beside the scheduled run's."""
    write_results(tmp_path / "sync", 0, 70.0, 1.0, config={"label": "fedavg synchronous"})
    assert "client ACC (%)" not in row(report([tmp_path]))
    write_results(tmp_path / "staggered", 0, 60.0, 3.0, config={"label": "fedavg staggered"},
                  schedule={"name": "staggered", "client_acc_mean": 61.5, "client_fgt_mean": 2.25})
    assert [(r["method"], r["client ACC (%)"], r["client FGT (%)"]) for r in rows(report([tmp_path]))] == [
        ("fedavg staggered", "61.50", "2.25"), ("fedavg synchronous", "–", "–")]


def test_a_target_no_run_reached_says_so(tmp_path):
    write_results(tmp_path / "s0", 0, 70.0, 1.0, rounds_to_target={"0": {"99": None}})
    assert row(report([tmp_path]))["rounds to 99%"] == "never reached"


def test_a_group_that_set_no_target_is_not_said_to_have_missed_it(tmp_path):
    """ The group without target_accuracies showed "never reached" (the CSV was right)."""
    write_results(tmp_path / "a", 0, 70.0, 1.0, config={"lr": 0.05}, rounds_to_target={"0": {"90": None}})
    write_results(tmp_path / "b", 0, 80.0, 1.0, config={"lr": 0.5, "target_accuracies": [50]},
                  rounds_to_target={"0": {"50": 3}})
    write_results(tmp_path / "c", 0, 60.0, 1.0, config={"lr": 5.0})
    found = {r["method"]: (r["rounds to 50%"], r["rounds to 90%"]) for r in rows(report([tmp_path]))}
    assert found == {"fedavg lr=0.05": ("no target set", "never reached"), "fedavg lr=0.5": ("3.0", "no target set"),
                     "fedavg lr=5.0": ("no target set", "no target set")}
    csv_rows = {r["method"]: r for r in csv.DictReader(io.StringIO(report([tmp_path], "csv")))}
    assert [csv_rows["fedavg lr=5.0"][f"rounds to 50% {c}"] for c in ("mean", "std", "n")] == ["", "", "0"]


def test_one_seed_shows_zero_std_and_missing_fields_a_dash(tmp_path):
    write_results(tmp_path / "s0", 0, 71.234, -0.5)
    r = row(report([tmp_path], options=TableOptions(columns=("seeds", "acc", "fgt", "bwt"))))
    assert (r["seeds"], r["ACC (%)"], r["FGT (%)"], r["BWT (%)"]) == ("0", "71.23", "-0.50", "–")
    assert not any(title.startswith("rounds to") for title in r)


def test_csv_parses_with_full_precision_mean_std_and_n(tmp_path):
    write_results(tmp_path / "a", 0, 70.0, 1.0, config={"lr": 0.5})
    write_results(tmp_path / "b", 1, 80.0, 2.0, config={"lr": 0.5})
    write_results(tmp_path / "c", 0, 10.0, 3.0, config={"lr": 0.05})
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    found = list(csv.DictReader(io.StringIO(report([tmp_path], "csv"))))
    assert [(r["method"], r["seeds"], float(r["ACC (%) mean"]), r["ACC (%) n"]) for r in found] == [
        ("fedavg lr=0.05", "0", 10.0, "1"), ("fedavg lr=0.5", "0,1", 75.0, "2")]
    assert found[0]["ACC (%) std"] == "" and float(found[1]["ACC (%) std"]) == 50 ** 0.5  # one run: no std
    assert found[0]["wall (s) mean"] == "" and found[0]["wall (s) n"] == "0"


def test_a_directory_given_twice_is_counted_once(tmp_path):
    write_results(tmp_path / "s0", 0, 70.0, 1.0)
    write_results(tmp_path / "s1", 1, 90.0, 1.0)
    r = row(report([tmp_path, tmp_path / "s0", f"{tmp_path}/../{tmp_path.name}/s1/results.json"]))
    assert (r["seeds"], r["ACC (%)"]) == ("0,1", "80.00 ± 14.14")


def test_config_yaml_beside_results_is_used_when_results_has_no_config(tmp_path):
    write_results(tmp_path / "a", 0, 70.0, 1.0)
    write_results(tmp_path / "b", 1, 70.0, 1.0, config=None)
    old = tmp_path / "b" / "results.json"
    body = json.loads(old.read_text())
    del body["config"]
    old.write_text(json.dumps(body))
    (tmp_path / "b" / "config.yaml").write_text("seed: 1\nlr: 0.5\n")
    assert [r["method"] for r in rows(report([tmp_path]))] == ["fedavg lr=0.05", "fedavg lr=0.5"]


@pytest.mark.parametrize(("damage", "words"), [
    ("truncated", "unreadable"),
    ("empty object", "missing or invalid 'stream', 'partition', 'method', 'seed', 'acc', 'fgt'"),
    ("acc null", "missing or invalid 'acc'"),
    ("not an object", "not a JSON object"),
    ("incomplete", "incomplete run (1 of 2 tasks)"),
    ("no config", "no 'config' field and no readable config.yaml beside it"),
])
def test_a_damaged_results_file_is_skipped_with_a_warning_naming_it(tmp_path, capsys, damage, words):
    write_results(tmp_path / "good", 0, 80.0, 1.0)
    bad = tmp_path / "bad" / "results.json"
    write_results(bad.parent, 1, 60.0, 1.0)
    text = bad.read_text()
    body = json.loads(text)
    bad.write_text({"truncated": text[: len(text) // 2], "empty object": "{}", "not an object": "[1, 2]",
                    "acc null": text.replace("60.0", "null"),
                    "incomplete": json.dumps({**body, "complete": False, "tasks_completed": 1, "num_tasks": 2}),
                    "no config": json.dumps({k: v for k, v in body.items() if k != "config"})}[damage])
    assert main(["report", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    r = row(out.strip())
    assert (r["seeds"], r["ACC (%)"]) == ("0", "80.00")
    assert f"skipped {bad}" in err and words in err


def test_only_damaged_results_is_an_error(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{")
    assert main(["report", str(tmp_path)]) == 2
    assert "no readable results.json" in capsys.readouterr().err
