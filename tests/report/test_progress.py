"""Progress bars are drawn on a terminal only: a log file or pipe gets no tqdm output."""

from __future__ import annotations

import io
import sys

import pytest

from cfl.report.progress import ProgressBars


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drive(bars: ProgressBars) -> None:
    """One task of two rounds with an evaluation, as the runner calls the hooks."""
    bars.round_end({"task": 0, "train_loss": 1.5})
    bars.evaluation({"mean_acc": 50.0})
    bars.round_end({"task": 0, "train_loss": 1.0})
    bars.task_end(0, {"mean_acc": 75.0})


@pytest.mark.parametrize(("tty", "enabled", "drawn"), [(True, True, True), (False, True, False), (True, False, False)])
def test_bars_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, tty: bool, enabled: bool, drawn: bool) -> None:
    err = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    drive(ProgressBars(num_tasks=1, rounds_per_task=2, method="fedavg", enabled=enabled))
    assert ("fedavg task 0 of 0-0" in err.getvalue()) is drawn
    if drawn:
        assert "2/2" in err.getvalue() and "acc=75.0" in err.getvalue()
