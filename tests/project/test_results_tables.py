"""docs/results.md's evidence tables equal what benchmarks/campaign.py generates from the committed records
(benchmarks/results/), so no number in them is typed by hand; an edited or missing table is detected."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from campaign_plan import RESULTS_ROOT, load_tables  # noqa: E402
from campaign_tables import check_tables, render_table, write_tables  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402
from cfl.report.groups import load_runs  # noqa: E402

DOC = ROOT / "docs" / "results.md"


def test_the_committed_tables_equal_their_records() -> None:
    stale = check_tables(DOC, load_tables(), RESULTS_ROOT)
    assert stale == [], f"run `python benchmarks/campaign.py tables --write docs/results.md` ({stale} differ)"


def test_a_hand_edited_or_missing_table_is_detected_and_rewritten(tmp_path: Path) -> None:
    tables = load_tables()
    first = next(iter(tables))
    doc = tmp_path / "results.md"
    text = DOC.read_text()
    start = text.index(f"<!-- campaign:{first} -->\n") + len(f"<!-- campaign:{first} -->\n")
    doc.write_text(text[:start] + "| typed | 99.99 |\n" + text[start:])
    assert check_tables(doc, tables, RESULTS_ROOT) == [first]
    write_tables(doc, tables, RESULTS_ROOT)
    assert check_tables(doc, tables, RESULTS_ROOT) == [] and doc.read_text() == text
    doc.write_text(text.replace(f"<!-- /campaign:{first} -->", ""))
    assert first in check_tables(doc, tables, RESULTS_ROOT)


def _record(path: Path, stream: str, label: str, acc: float) -> None:
    path.mkdir(parents=True)
    path.joinpath("results.json").write_text(json.dumps({
        "stream": stream, "scenario": "class", "partition": "iid", "method": label, "seed": 0, "acc": acc, "fgt": 1.0,
        "complete": True, "config": {"seed": 0, "label": label, "stream": {"name": stream}},
        "record": {"commit": "abc", "machine": {"cpu": "cpu", "cores": 2, "torch": "2"}}}))


def test_a_table_over_two_streams_names_a_stream_column_and_unknown_columns_are_refused(tmp_path: Path) -> None:
    _record(tmp_path / "two" / "a", "split-digits", "fedncm", 50.0)
    _record(tmp_path / "two" / "b", "split-fmnist", "fedncm", 60.0)
    table = {"title": "Two", "sweeps": ["x.yaml"], "seeds": [0], "columns": ["stream", "method", "acc"]}
    body = render_table("two", table, tmp_path)
    assert "| stream | method | ACC (%) |" in body
    assert "| split-digits (class-IL) | fedncm | 50.00 |" in body
    assert "| split-fmnist (class-IL) | fedncm | 60.00 |" in body
    bad = tmp_path / "tables.yaml"
    bad.write_text("tables:\n  two: {sweeps: [benchmarks/reproduce/split-fmnist.yaml], columns: [stream, nope]}\n")
    with pytest.raises(ConfigError, match=r"unknown column\(s\) 'nope'"):
        load_tables(bad)


def test_a_tables_failed_runs_are_listed_under_it_never_as_rows(tmp_path: Path) -> None:
    _record(tmp_path / "t" / "fedncm__seed=0", "split-fmnist", "fedncm", 50.0)
    stop = ("non-finite loss or update at task 1 (0-based), round 13 of the task, client(s) [0]; lower lr "
            "(now 0.01) or check the method's parameters. Likely cause: method ewc's penalty has weight 4330 on "
            "parameter head.bias of client 14; a local SGD step (lr 0.01, momentum 0.0) on a quadratic penalty "
            "diverges where lr x weight > 2 (1 + momentum), here 43.3 > 2: lower the penalty's strength. Stopped; "
            "the last checkpoint is kept")
    failed = tmp_path / "t" / "ewc__seed=0"
    failed.mkdir()
    failed.joinpath("failed.json").write_text(json.dumps({
        "failed": True, "exit_code": 3, "stop": stop, "cause": "-", "config": {"seed": 0, "label": "ewc"},
        "record": {"run": "ewc__seed=0", "commit": "abc", "machine": {"cpu": "cpu", "cores": 2, "torch": "2"}}}))
    table = {"title": "T", "sweeps": ["x.yaml"], "seeds": [0], "columns": ["method", "runs", "acc"]}
    body = render_table("t", table, tmp_path)
    assert body.endswith("1 records; commits abc; machines: cpu (2 cores), torch 2.\n\n"
                         "Diverged (1 run, exit 3, no numbers: failure records `failed.json`):\n\n"
                         "- ewc__seed=0: ewc's penalty: lr x weight = 43.3 > 2 at task 1 (0-based), round 13")
    assert "| fedncm | 1 | 50.00 |" in body and "| ewc" not in body
    assert [run.path.parent.name for run in load_runs([tmp_path / "t"])] == ["fedncm__seed=0"]  # cfl report's reader
    (tmp_path / "t" / "fedncm__seed=0" / "results.json").unlink()
    assert render_table("t", table, tmp_path).endswith(
        "(add `--set device=cuda` on a GPU).\n\nDiverged (1 run, exit 3, no numbers: failure records `failed.json`):"
        "\n\n- ewc__seed=0: ewc's penalty: lr x weight = 43.3 > 2 at task 1 (0-based), round 13")


def test_every_committed_record_agrees_with_its_own_acc_matrix() -> None:
    from campaign_record_checks import inconsistent_records

    assert inconsistent_records(RESULTS_ROOT, load_tables()) == []


def test_a_record_whose_acc_matrix_was_edited_stops_tables_check(tmp_path: Path) -> None:
    """The table is made from the summary, so an edited matrix leaves it unchanged: the record is checked
    against itself, and ``tables --check`` exits 1 naming it."""
    import shutil
    import subprocess

    from campaign_record_checks import record_problems

    tables = load_tables()
    name = next(n for n in tables if any((RESULTS_ROOT / n).rglob("results.json")))
    root = tmp_path / "results"
    shutil.copytree(RESULTS_ROOT / name, root / name)
    synchronous = [p for p in sorted((root / name).rglob("results.json"))
                   if json.loads(p.read_text())["config"].get("schedule", {}).get("name", "synchronous")
                   == "synchronous"]
    path = synchronous[0]
    record = json.loads(path.read_text())
    assert record_problems(record) == []
    record["acc_matrix"][-1][0] += 5.0
    path.write_text(json.dumps(record))
    assert [p.split(" but")[0] for p in record_problems(record)] == [
        f"acc is {record['acc']:.6g}", f"fgt is {record['fgt']:.6g}", f"bwt is {record['bwt']:.6g}",
        f"aia is {record['aia']:.6g}"]
    doc = tmp_path / "results.md"
    doc.write_text(DOC.read_text())
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "campaign.py"), "tables", "--check", str(doc),
                           "--results", str(root)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1 and f"{path}: acc is" in done.stderr, done.stderr


def test_every_committed_record_is_of_the_config_its_sweep_gives_today() -> None:
    from campaign_stale import stale_records

    assert stale_records(load_tables(), RESULTS_ROOT) == []
