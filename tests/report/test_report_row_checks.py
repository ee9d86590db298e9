"""``cfl report``: a row never mixes runs of different task counts, and a significance mark that rests on 2
seeds (one degree of freedom) is warned about."""

from __future__ import annotations

import pytest

from cfl.config.keys import ConfigError
from cfl.report.table import TableOptions, report
from tests.report.test_report import write_results


def test_runs_of_different_task_counts_in_one_row_are_refused_naming_them(tmp_path):
    """The two configs leave stream.num_tasks at the default, but one run learned 3 tasks and the other 5."""
    write_results(tmp_path / "three", 0, 70.0, 5.0, num_tasks=3, config={"label": "mine"})
    write_results(tmp_path / "five", 1, 60.0, 9.0, num_tasks=5, config={"label": "mine"})
    with pytest.raises(ConfigError) as err:
        report([tmp_path], options=TableOptions(columns=("method", "acc")))
    text = str(err.value)
    assert "different task counts" in text and "3 tasks:" in text and "5 tasks:" in text
    assert str(tmp_path / "three") in text and "label" in text


def test_runs_of_one_task_count_still_share_a_row(tmp_path):
    for seed in (0, 1):
        write_results(tmp_path / f"s{seed}", seed, 70.0 + seed, 5.0, num_tasks=3)
    assert "| 2 |" in report([tmp_path], options=TableOptions(columns=("method", "runs", "acc")))


def test_a_mark_on_two_seeds_is_warned_about(tmp_path, capsys):
    for name, accs in (("fedavg", [70.0, 72.0]), ("ewc", [71.0, 73.0001])):
        for seed, acc in enumerate(accs):
            write_results(tmp_path / f"{name}-{seed}", seed, acc, 1.0, method=name,
                          config={"method": {"name": name}})
    table = report([tmp_path], options=TableOptions(columns=("method", "acc")))
    err = capsys.readouterr().err
    assert "†" in table
    assert "cfl: warning: † on ewc ACC (%) rests on 2 seeds" in err and "1 degree(s) of freedom" in err, err


def test_a_mark_on_two_seeds_is_footnoted_in_the_table_itself(tmp_path):
    """The warning on stderr does not travel with a table pasted into a document: its note says it too."""
    for name, accs in (("fedavg", [70.0, 72.0]), ("ewc", [71.0, 73.0001])):
        for seed, acc in enumerate(accs):
            write_results(tmp_path / f"{name}-{seed}", seed, acc, 1.0, method=name,
                          config={"method": {"name": name}})
    table = report([tmp_path], options=TableOptions(columns=("method", "acc")))
    note = [line for line in table.splitlines() if line.startswith("† differs")]
    assert len(note) == 1 and "a mark on 2 seeds rests on a test of 1 degree(s) of freedom" in note[0], table


def test_a_mark_on_four_seeds_is_not_warned_about(tmp_path, capsys):
    from tests.report.test_report_paper import four_seeds

    four_seeds(tmp_path)
    table = report([tmp_path], options=TableOptions(columns=("method", "acc")))
    assert "†" in table and "degree(s) of freedom" not in table
    assert "degree(s) of freedom" not in capsys.readouterr().err


def test_the_upload_unit_is_chosen_for_the_column(tmp_path):
    """2 MiB and 5 MiB uploads read 0.002 and 0.005 in GiB: the column reads MiB; 3 GiB and more stay GiB."""
    from tests.report.test_report import rows

    for seed, size in enumerate((2 * 2 ** 20, 5 * 2 ** 20)):
        write_results(tmp_path / "small" / f"s{seed}", seed, 70.0, 1.0, upload_bytes=size)
    found = rows(report([tmp_path / "small"], options=TableOptions(columns=("method", "upload"))))
    assert found == [{"method": "fedavg", "upload (MiB)": "3.500 ± 2.121"}]
    write_results(tmp_path / "large" / "s0", 0, 70.0, 1.0, upload_bytes=3 * 2 ** 30)
    assert rows(report([tmp_path / "large"], options=TableOptions(columns=("method", "upload"))))[0][
        "upload (GiB)"] == "3.000"
