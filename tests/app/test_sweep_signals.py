"""`cfl sweep --jobs 2` as a real process, signalled: a SIGKILL of the sweep leaves no worker
and no resource tracker holding its stdout (so `cfl sweep ... | tee log` ends), and a SIGINT starts no further
run, stops the running ones with their checkpoints and exits with 130. Every process started is killed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

BASE = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 40, "batch_size": 32, "threads": 1, "checkpoint_every": 1, "wandb": {"mode": "disabled"}}
SLOW = '''
import time
from cfl.engine.rounds.runner import Runner

_real = Runner.run_round

def _slow(self, task, rnd):
    time.sleep(0.2)  # a round of a few tenths of a second, so the test can signal the sweep mid-run
    return _real(self, task, rnd)

Runner.run_round = _slow
'''
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the process tree")


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def sweep(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "grid": {"seed": [0, 1, 2, 3]},
                                                         "out": str(tmp_path / "runs")}))
    started: list[subprocess.Popen] = []

    def start():
        cmd = [sys.executable, "-m", "cfl", "sweep", str(tmp_path / "sweep.yaml"), "--jobs", "2", "--plugin",
               str(tmp_path / "slow.py")]
        proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        started.append(proc)
        deadline = time.monotonic() + 120  # both workers have written a checkpoint after some rounds
        runs = tmp_path / "runs"
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = [p for p in runs.glob("seed=*/metrics.jsonl") if p.read_text().count('"round"') >= 2]
            if len(metrics) >= 2:
                return proc, _descendants(proc.pid)
            time.sleep(0.1)
        raise AssertionError(f"the sweep did not reach two running runs: {proc.communicate(timeout=30)}")

    yield start, tmp_path
    for proc in started:
        for pid in _descendants(proc.pid) | {proc.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate(timeout=30)


def test_sigkill_of_the_sweep_kills_its_workers_and_closes_its_stdout(sweep):
    start, _ = sweep
    proc, children = start()
    assert len(children) >= 3  # two workers and the resource tracker
    proc.kill()
    proc.communicate(timeout=30)  # EOF on stdout and stderr: no process holds them any more
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)]


def test_sigint_starts_no_further_run_and_keeps_the_running_ones(sweep):
    start, tmp_path = sweep
    proc, children = start()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "2 run(s) not started" in err and "resume the sweep with the same command" in err, err
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["seed=0", "seed=1"], (runs, out, err)
    for name in runs:
        assert (tmp_path / "runs" / name / "checkpoint.pt").is_file() and "Resume with" in out + err
    deadline = time.monotonic() + 15  # the resource tracker ends once the last holder of its pipe has (asynchronously)
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)]
