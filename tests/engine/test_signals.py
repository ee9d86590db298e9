"""Signals outside the round loop: before training (real processes), a second signal, and while the
outputs are written. The exit code is always 128 + the signal that stopped the run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import cfl.app.single_run
from cfl.app.cli import main
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint

TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 2, "batch_size": 32, "lr": 0.05, "checkpoint_every": 1, "threads": 1,
        "wandb": {"mode": "disabled"}}

# A plugin that marks the moment it is reached and then sleeps, so a real process can be signalled there:
# at the plugin's import (cli, before any run), or inside data loading (cfl.app.single_run.load_stream).
STALL = '''
import os, time
from pathlib import Path
import cfl.app.single_run

def stall():
    Path(os.environ["CFL_TEST_MARK"]).touch()
    time.sleep(60)

if os.environ["CFL_TEST_STALL"] == "import":
    stall()
else:
    cfl.app.single_run.load_stream = lambda *_, **__: stall()
'''


@pytest.fixture
def config(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (tmp_path / "stall.py").write_text(STALL)
    return tmp_path / "tiny.yaml"


@pytest.mark.parametrize("stage", ["import", "data"])
def test_sigterm_before_training_stops_at_once_with_a_message_and_leaves_nothing(config, stage):
    tmp = config.parent
    out, mark = tmp / "run", tmp / "reached"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CFL_TEST_STALL": stage, "CFL_TEST_MARK": str(mark)}
    cmd = [sys.executable, "-m", "cfl", "run", str(config), "--out", str(out), "--quiet", "--plugin",
           str(tmp / "stall.py")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mark.exists(), proc.communicate(timeout=10)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "stopped" in err and "SIGTERM" in err and "Traceback" not in err
    if stage == "data":
        assert "nothing was trained, so nothing is kept" in err
    assert not out.exists()  # nothing that would block the same command run again


def signals_after_round(monkeypatch, signums, after_round):
    """Deliver ``signums`` to this process, one after another, at the end of global round ``after_round``."""
    real = Runner.run_round

    def run_round(self, task, rnd):
        record = real(self, task, rnd)
        if record["round"] == after_round:
            for s in signums:
                signal.raise_signal(s)
        return record

    monkeypatch.setattr(Runner, "run_round", run_round)


@pytest.fixture
def no_default_sigterm():
    """Outside cfl's handlers a SIGTERM raises here instead of killing the test process."""
    def fail(*_):
        raise AssertionError("SIGTERM reached a handler outside cfl")
    before = signal.signal(signal.SIGTERM, fail)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.usefixtures("no_default_sigterm")
def test_a_second_sigterm_stops_at_once_with_143(config, monkeypatch, capsys):
    out = config.parent / "twice"
    signals_after_round(monkeypatch, [signal.SIGTERM, signal.SIGTERM], after_round=3)
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 143
    err = capsys.readouterr().err
    assert "stopped at once by SIGTERM" in err and "after round 2" in err and f"--resume {out}" in err
    assert checkpoint.load(out)["progress"]["global_round"] == 2
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0


@pytest.mark.usefixtures("no_default_sigterm")
@pytest.mark.parametrize("count", [1, 2])
def test_sigterm_while_the_plots_are_written(config, monkeypatch, capsys, count):
    """One signal: the outputs are completed (exit 0). Two: stopped at once, but results.json is written before any
    figure, so the results are kept; a resume draws the figures again."""
    out = config.parent / f"plots{count}"
    real = cfl.app.single_run.write_plots

    def write_plots(*args):
        for _ in range(count):
            signal.raise_signal(signal.SIGTERM)
        return real(*args)

    monkeypatch.setattr(cfl.app.single_run, "write_plots", write_plots)
    code = main(["run", str(config), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    if count == 1:
        assert code == 0, err
        assert json.loads((out / "results.json").read_text())["complete"] is True
        assert (out / "acc_matrix.png").is_file() and (out / "accuracy_curve.png").is_file()
    else:
        assert code == 143, err
        assert json.loads((out / "results.json").read_text())["complete"] is True
        assert not (out / "acc_matrix.png").exists()
        monkeypatch.undo()
        assert main(["run", "--resume", str(out), "--quiet"]) == 0  # rebuilds the outputs from the checkpoint
        assert (out / "acc_matrix.png").is_file() and Path(out / "results.json").is_file()


@pytest.mark.usefixtures("no_default_sigterm")
def test_a_signal_inside_the_round0_checkpoint_save_keeps_that_checkpoint_resumable(config, monkeypatch, capsys):
    """A SIGTERM once the round-0 checkpoint is renamed into place but before the save returns (a campaign's
    cut-off there, under load) stops the run at once; that checkpoint is whole, so it is kept with its config.yaml
    and resumes to the straight run's numbers (the clean-up once deleted config.yaml, leaving a checkpoint no
    resume could use)."""
    assert main(["run", str(config), "--out", str(config.parent / "straight"), "--quiet"]) == 0
    out = config.parent / "cut"
    real, calls = checkpoint.atomic_write_bytes, []

    def write_then_signal(path, data):
        real(path, data)
        calls.append(path)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", write_then_signal)
    assert main(["run", str(config), "--out", str(out), "--quiet"]) == 143
    err = capsys.readouterr().err
    assert "stopped at once by SIGTERM" in err and "after round 0" in err and f"--resume {out}" in err, err
    assert (out / "config.yaml").is_file() and checkpoint.load(out)["progress"]["global_round"] == 0
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    matrix = [json.loads((d / "results.json").read_text())["acc_matrix"] for d in (config.parent / "straight", out)]
    assert matrix[0] == matrix[1]
