"""One task numbering wherever a user reads a task index: from 0, as in results.json."""

import re
import signal
from pathlib import Path

import pytest

from cfl.app.cli import main
from cfl.task_numbering import task_name
from tests.engine.test_signals import config, no_default_sigterm, signals_after_round  # noqa: F401 (fixtures)


def test_task_names_number_from_0():
    assert task_name(2) == "task 2 (0-based)"
    assert task_name(2, 5) == "task 2 of 0-4"


@pytest.mark.usefixtures("no_default_sigterm")
def test_the_stop_message_names_the_task_from_0(config, monkeypatch, capsys):  # noqa: F811
    """TINY: 2 tasks of 2 rounds; a signal in round 3 stops in the second task, task 1."""
    out = config.parent / "stopped"
    signals_after_round(monkeypatch, [signal.SIGTERM], after_round=3)
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 143
    err = capsys.readouterr().err
    assert "stopped by SIGTERM after round 3 (task 1 of 0-1)" in err, err


def test_no_message_numbers_tasks_from_1():
    """No f-string of cfl shows ``task {t + 1}`` (a count from 1 beside indices from 0)."""
    shifted = re.compile(r"task \{[^}]*\+ ?1\}")
    found = [f"{path}:{i}" for path in sorted(Path("cfl").rglob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if shifted.search(line)]
    assert not found, found
