"""W&B failures never stop a run and never cost a local output; a resumed run continues its W&B run."""

import json
import os
import signal
import subprocess
import sys

import pytest
import wandb
import yaml

from cfl.app.cli import main
from cfl.engine.rounds.runner import Runner
from cfl.report.plots import PLOT_FILES

TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 2, "batch_size": 32, "lr": 0.05, "eval_every": 1, "threads": 1,
        "wandb": {"mode": "offline"}}
OUTPUTS = ("results.json", "metrics.jsonl", "config.yaml", *PLOT_FILES, "checkpoint.pt")


def write_tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture
def config(tmp_path):
    return write_tiny(tmp_path)


def assert_complete(out):
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and all(v is not None for v in results["acc_matrix"][-1])
    kinds = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("evaluation") == 4
    return results


class FakeRun:
    """Stands in for a wandb run; ``fail`` names the calls that raise."""

    def __init__(self, run_id="fake-run-1", fail=()):
        self.id, self.fail, self.summary, self.logged, self.config = run_id, set(fail), {}, [], {}

    def started(self, kwargs):
        """``wandb.init(**kwargs)``: the run records the config it is given."""
        self.config = kwargs["config"]
        return self

    def define_metric(self, name, step_metric=None):
        if "define_metric" in self.fail:
            raise RuntimeError("wandb.define_metric: service died")

    def log_artifact(self, artifact):
        if "log_artifact" in self.fail:
            raise OSError(28, "No space left on device (artifact staging)")

    def log(self, data, step=None):
        if "log" in self.fail:
            raise ConnectionError("wandb.log: network unreachable")
        self.logged.append((step, data))

    def finish(self):
        if "finish" in self.fail:
            raise RuntimeError("wandb.finish: service died")


def test_init_failure_leaves_a_complete_run(config, tmp_path, monkeypatch):
    def init(**_):
        raise wandb.errors.AuthenticationError("bad API key")

    monkeypatch.setattr(wandb, "init", init)
    with pytest.warns(UserWarning, match="W&B init failed.*bad API key"):
        assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert assert_complete(tmp_path / "run")["wandb_run_id"] is None


@pytest.mark.parametrize(("fail", "stage"), [(("log",), "log"), (("finish",), "finish"), (("log", "finish"), "log"),
                                             (("log_artifact",), "finish"), (("define_metric",), "init")])
def test_exceptions_inside_wandb_calls_leave_a_complete_run(config, tmp_path, monkeypatch, fail, stage):
    run = FakeRun(fail=fail)
    monkeypatch.setattr(wandb, "init", lambda **kw: run.started(kw))
    with pytest.warns(UserWarning, match=f"W&B {stage} failed"):
        assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert assert_complete(tmp_path / "run")["wandb_run_id"] == "fake-run-1"  # the W&B run exists
    assert run.logged == [] if stage in ("log", "init") else len(run.logged) > 4


def test_resume_continues_the_same_wandb_run(config, tmp_path, monkeypatch):
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        return FakeRun(run_id=kwargs["id"] or "first-id").started(kwargs)

    monkeypatch.setattr(wandb, "init", init)
    real = Runner.run_round

    def interrupted(self, task, rnd):
        record = real(self, task, rnd)
        if record["round"] == 3:
            signal.raise_signal(signal.SIGINT)
        return record

    monkeypatch.setattr(Runner, "run_round", interrupted)
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--quiet", "--set", "lr=0.1"]) == 130
    monkeypatch.setattr(Runner, "run_round", real)
    assert main(["run", "--resume", str(out), "--quiet", "--set", "wandb.project=elsewhere"]) == 0
    assert calls[0]["id"] is None and calls[0]["resume"] is None
    assert calls[1]["id"] == "first-id" and calls[1]["resume"] == "allow" and len(calls) == 2
    assert calls[1]["group"] == calls[0]["group"] and "/lr=0.1#" in calls[0]["group"]  # the group it started in
    assert assert_complete(out)["wandb_run_id"] == "first-id"


def test_online_mode_with_bad_credentials_and_no_network(config, tmp_path):
    """The real wandb client: online, a bad key, and a server that refuses connections."""
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_API_KEY": "bad" * 13 + "x", "WANDB_BASE_URL": "http://127.0.0.1:9",
           "WANDB_INIT_TIMEOUT": "3", "OMP_NUM_THREADS": "1"}
    env.pop("WANDB_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "cfl", "run", str(config), "--out", str(out), "--quiet",
                           "--set", "wandb.mode=online"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "W&B init failed" in proc.stderr and "continuing with local outputs only" in proc.stderr
    assert_complete(out)
