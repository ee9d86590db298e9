"""Resume: a run killed with SIGKILL (a real process) or stopped by SIGINT/SIGTERM ends exactly like an
uninterrupted run, with no duplicated metrics lines."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from cfl.cli import main
from cfl.engine.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import Method

# the FOT MLP (dropout 0.2/0.5/0.5) on digits: resuming must restore torch's generator too
TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "model": {"name": "mlp"}, "num_clients": 4,
        "clients_per_round": 2, "rounds_per_task": 3, "batch_size": 32, "lr": 0.05, "eval_every": 1,
        "checkpoint_every": 1, "threads": 1, "wandb": {"mode": "disabled"}, "plugins": [{"name": "slow"}]}

SLOW_PLUGIN = '''
import os, time
from cfl.methods import register
from cfl.methods.base import Method


@register
class Slow(Method):
    name = "slow"
    about = "test helper: FedAvg that sleeps $CFL_TEST_ROUND_SLEEP seconds per round (a window to kill in)"

    def round_end(self, payloads, server):
        time.sleep(float(os.environ.get("CFL_TEST_ROUND_SLEEP", "0")))
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The config and plugin files, and the uninterrupted run (in process, no sleeping)."""
    root = tmp_path_factory.mktemp("resume")
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (root / "slow.py").write_text(SLOW_PLUGIN)
    namespace: dict = {}
    exec(SLOW_PLUGIN.replace("@register\n", ""), namespace)
    METHODS["slow"] = namespace["Slow"]
    try:
        assert main(["run", str(root / "tiny.yaml"), "--out", str(root / "reference"), "--quiet"]) == 0
    finally:
        del METHODS["slow"]
    return root


def outputs(run_dir: Path) -> tuple:
    results = json.loads((run_dir / "results.json").read_text())
    params = torch.load(run_dir / "checkpoint.pt", weights_only=True)["params"]
    return results["acc_matrix"], (run_dir / "metrics.jsonl").read_text(), params


def assert_same_outputs(run_dir: Path, reference: Path) -> None:
    matrix, metrics, params = outputs(run_dir)
    ref_matrix, ref_metrics, ref_params = outputs(reference)
    assert matrix == ref_matrix  # floats compared exactly
    assert metrics == ref_metrics  # every evaluation once, in order, identical
    assert all(torch.equal(params[k], ref_params[k]) for k in ref_params)


def saved_round(run_dir: Path) -> int:
    try:
        return torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]["global_round"]
    except (FileNotFoundError, RuntimeError, EOFError):
        return -1


def test_sigkill_at_any_moment_then_resume_gives_the_same_run(setup, monkeypatch):
    out = setup / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CFL_TEST_ROUND_SLEEP": "0.8"}
    cmd = [sys.executable, "-m", "cfl", "run", str(setup / "tiny.yaml"), "--out", str(out), "--quiet",
           "--plugin", str(setup / "slow.py")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while saved_round(out) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # somewhere inside round 3: mid-training, mid-write or between writes
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run was not killed mid-run: {err}"
    killed_at = saved_round(out)
    assert 2 <= killed_at < 6 and not (out / "results.json").exists()

    # resumed in this process (the kill is what needed a real process)
    monkeypatch.setitem(METHODS, "slow", type("Slow", (Method,), {"name": "slow"}))
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert_same_outputs(out, setup / "reference")


def stop_with(monkeypatch, signum: int, after_round: int) -> None:
    """Deliver ``signum`` to this process during global round ``after_round`` (1-based)."""
    real = Runner.run_round

    def run_round(self, task, rnd):
        record = real(self, task, rnd)
        if record["round"] == after_round:
            signal.raise_signal(signum)
        return record

    monkeypatch.setattr(Runner, "run_round", run_round)


@pytest.mark.parametrize(("signum", "code", "after_round"), [(signal.SIGINT, 130, 2), (signal.SIGTERM, 143, 4)])
def test_signal_stops_after_the_round_with_a_checkpoint_and_resume_finishes(setup, monkeypatch, capsys,
                                                                            signum, code, after_round):
    out = setup / f"stopped-{signum}"
    monkeypatch.setitem(METHODS, "slow", type("Slow", (Method,), {"name": "slow"}))
    stop_with(monkeypatch, signum, after_round)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the tests run in a background job
    assert main(["run", str(setup / "tiny.yaml"), "--out", str(out), "--quiet"]) == code
    err = capsys.readouterr().err
    assert f"stopped by {signal.Signals(signum).name} after round {after_round}" in err
    assert f"cfl run --resume {out}" in err
    assert saved_round(out) == after_round and not (out / "results.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # handlers are put back
    monkeypatch.undo()
    monkeypatch.setitem(METHODS, "slow", type("Slow", (Method,), {"name": "slow"}))
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert_same_outputs(out, setup / "reference")


def test_resuming_a_finished_run_rebuilds_its_outputs_without_training(setup, monkeypatch):
    out = setup / "reference"
    before = outputs(out)
    monkeypatch.setitem(METHODS, "slow", type("Slow", (Method,), {"name": "slow"}))
    monkeypatch.setattr(Runner, "run_round", lambda *_: pytest.fail("a finished run trained again"))
    assert main(["run", "--resume", str(out), "--quiet", "--set", "threads=2"]) == 0
    after = outputs(out)
    assert after[0] == before[0] and after[1] == before[1]
    assert yaml.safe_load((out / "config.yaml").read_text())["threads"] == 2  # result-neutral key updated
