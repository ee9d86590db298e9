"""`cfl report`: mean ± std (sample std) checked by hand, damaged results skipped, duplicates counted once."""

import json

import pytest

from cfl.cli import main
from cfl.report.table import report


def write_results(path, seed, acc, fgt, **extra):
    path.mkdir(parents=True)
    body = {"stream": "split-digits", "partition": "iid", "method": "fedavg", "seed": seed, "acc": acc,
            "fgt": fgt, "complete": True, **extra}
    (path / "results.json").write_text(json.dumps(body))


def row(table: str) -> list[str]:
    lines = table.splitlines()
    assert len(lines) == 3, table  # header, rule, one row
    return [c.strip() for c in lines[2].strip("|").split("|")]


def test_mean_and_sample_std_by_hand(tmp_path):
    # ACC 70, 80, 90: mean 80, sample std sqrt((100 + 0 + 100) / 2) = 10 (population std would be 8.16)
    # FGT 1, 2, 6: mean 3, sample std sqrt((4 + 1 + 9) / 2) = sqrt(7) = 2.6458 (population: 2.16)
    for seed, (acc, fgt) in enumerate([(70.0, 1.0), (80.0, 2.0), (90.0, 6.0)]):
        write_results(tmp_path / f"s{seed}", seed, acc, fgt)
    assert row(report([tmp_path])) == ["split-digits", "iid", "fedavg", "0,1,2", "80.00 ± 10.00", "3.00 ± 2.65"]


def test_one_seed_shows_zero_std(tmp_path):
    write_results(tmp_path / "s0", 0, 71.234, -0.5)
    assert row(report([tmp_path]))[3:] == ["0", "71.23 ± 0.00", "-0.50 ± 0.00"]


def test_a_directory_given_twice_is_counted_once(tmp_path):
    write_results(tmp_path / "s0", 0, 70.0, 1.0)
    write_results(tmp_path / "s1", 1, 90.0, 1.0)
    table = report([tmp_path, tmp_path / "s0", f"{tmp_path}/../{tmp_path.name}/s1/results.json"])
    assert row(table)[3:5] == ["0,1", "80.00 ± 14.14"]


@pytest.mark.parametrize(("damage", "words"), [
    ("truncated", "unreadable"),
    ("empty object", "missing or invalid 'stream', 'partition', 'method', 'seed', 'acc', 'fgt'"),
    ("acc null", "missing or invalid 'acc'"),
    ("not an object", "not a JSON object"),
])
def test_a_damaged_results_file_is_skipped_with_a_warning_naming_it(tmp_path, capsys, damage, words):
    write_results(tmp_path / "good", 0, 80.0, 1.0)
    bad = tmp_path / "bad" / "results.json"
    write_results(bad.parent, 1, 60.0, 1.0)
    text = bad.read_text()
    bad.write_text({"truncated": text[: len(text) // 2], "empty object": "{}", "not an object": "[1, 2]",
                    "acc null": text.replace("60.0", "null")}[damage])
    assert main(["report", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert row(out.strip())[3:5] == ["0", "80.00 ± 0.00"]
    assert f"skipped {bad}" in err and words in err


def test_only_damaged_results_is_an_error(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{")
    assert main(["report", str(tmp_path)]) == 2
    assert "no readable results.json" in capsys.readouterr().err
