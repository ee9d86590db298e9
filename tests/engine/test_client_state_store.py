"""client_state_store: the disk store gives the memory store's runs bit for bit, resumes after SIGKILL (in a
store write included), checkpoints incrementally, and is chosen, estimated and cleaned up as documented."""

import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from cfl.app.cli import main
from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint, state_budget
from cfl.engine.stores.disk_states import DiskClientStates
from cfl.methods import METHODS
from cfl.methods.base import Method
from tests.conftest import make_stream, method_spec, stream_for, tiny_config
from tests.engine.test_checkpoint import run_to_end as run
from tests.engine.test_resume import assert_same_outputs


def states_of(runner):
    return [{c: st.clients.get(c) for c in st.clients.ids()} for st in runner.states]


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", sorted(METHODS))
def test_disk_and_memory_stores_give_the_same_run(name, tmp_path):
    stream = stream_for(name, num_tasks=3)
    kw = {"method": method_spec(name), "rounds_per_task": 2, "num_clients": 5, "clients_per_round": 3}
    memory = run(tiny_config(client_state_store="memory", **kw), stream)
    disk = run(tiny_config(client_state_store="disk", **kw), stream, state_dir=tmp_path)
    assert memory.state_store == "memory" and disk.state_store == "disk"
    assert disk.progress.acc_matrix == memory.progress.acc_matrix
    assert all(torch.equal(disk.params[k], memory.params[k]) for k in memory.params)
    assert same(states_of(disk), states_of(memory))
    assert any(p.name.startswith("seg-") for p in tmp_path.rglob("*")) == any(len(s) for s in states_of(memory))


@pytest.mark.parametrize("name", ["ewc", "er"])
def test_disk_checkpoint_holds_a_manifest_and_resumes_bit_for_bit(name, tmp_path):
    cfg = tiny_config(client_state_store="disk", method={"name": name}, rounds_per_task=2, num_clients=6,
                      clients_per_round=3)
    stream = make_stream(num_tasks=3)
    whole = run(cfg, stream, state_dir=tmp_path / "whole")
    half = run(cfg, stream, state_dir=tmp_path / "states", stop_after=5)  # in task 3, two task ends done
    checkpoint.save(tmp_path, checkpoint.capture(half.snapshot(), None))
    for st in half.states:
        st.clients.committed()
    saved = checkpoint.load(tmp_path)["states"][0]["clients"]
    assert saved["store"] == "disk" and saved["records"].shape == (6, 4)  # 40 bytes a client, no state
    assert (tmp_path / "checkpoint.pt").stat().st_size < 200_000
    resumed = run(cfg, stream, state_dir=tmp_path / "states", payload=checkpoint.load(tmp_path))
    assert resumed.progress.acc_matrix == whole.progress.acc_matrix
    assert all(torch.equal(resumed.params[k], whole.params[k]) for k in whole.params)


def test_a_memory_checkpoint_resumes_on_disk_and_the_converse_is_refused(tmp_path):
    """A run can move its client states to disk when it outgrows memory (client_state_store is resume-safe)."""
    stream = make_stream(num_tasks=3)
    kw = {"method": {"name": "ewc"}, "rounds_per_task": 2, "num_clients": 5, "clients_per_round": 3}
    whole = run(tiny_config(client_state_store="memory", **kw), stream)
    half = run(tiny_config(client_state_store="memory", **kw), stream, stop_after=3)
    checkpoint.save(tmp_path, checkpoint.capture(half.snapshot(), None))
    resumed = run(tiny_config(client_state_store="disk", **kw), stream, state_dir=tmp_path / "states",
                  payload=checkpoint.load(tmp_path))
    assert resumed.progress.acc_matrix == whole.progress.acc_matrix
    half = run(tiny_config(client_state_store="disk", **kw), stream, state_dir=tmp_path / "states", stop_after=3)
    checkpoint.save(tmp_path, checkpoint.capture(half.snapshot(), None))
    with pytest.raises(ConfigError, match="client_state_store=disk"):
        run(tiny_config(client_state_store="memory", **kw), stream, payload=checkpoint.load(tmp_path))


def test_auto_chooses_the_disk_beyond_the_memory_budget_and_says_so(tmp_path, monkeypatch, capsys):
    stream = make_stream()
    cfg = tiny_config(method={"name": "ewc"})
    assert Runner(cfg, stream, state_dir=tmp_path).state_store == "memory"
    monkeypatch.setattr(state_budget, "MEMORY_BYTES", 1000)
    runner = Runner(cfg, stream, state_dir=tmp_path)
    assert runner.state_store == "disk" and isinstance(runner.states[0].clients, DiskClientStates)
    assert "client states on disk" in capsys.readouterr().err
    assert Runner(tiny_config(), stream, state_dir=tmp_path).state_store == "memory"  # fedavg keeps none


def test_a_disk_store_that_cannot_fit_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({
        "stream": {"name": "split-digits", "num_tasks": 2}, "method": {"name": "ewc"}, "num_clients": 6,
        "clients_per_round": 2, "rounds_per_task": 1, "client_state_store": "disk",
        "wandb": {"mode": "disabled"}}))
    monkeypatch.setattr(state_budget, "free_bytes", lambda _: 1000)
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "per-client state (ewc ~" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_estimates_its_client_state(name):
    """The estimate the store is chosen and the disk checked by covers what the method really keeps."""
    stream = stream_for(name, num_tasks=3, n_train=90)
    cfg = tiny_config(method=method_spec(name), rounds_per_task=2, num_clients=5, clients_per_round=3,
                      client_state_store="memory")
    runner = run(cfg, stream)
    estimate = runner.state_estimate[0]
    assert estimate is not None, f"{name} gives no client_state_bytes estimate"
    kept = sum(runner.states[0].clients.nbytes(c) for c in runner.states[0].clients.ids())
    assert kept <= estimate * cfg.num_clients
    assert (kept == 0) == (estimate == 0)


KILLER = '''
import os, signal
from cfl.engine.stores import disk_states
from cfl.methods import register
from cfl.methods.base import Method

real = disk_states._write_all
count = [0]


def killing_write(fd, buffers, offset):
    """Write half of the N-th client-state record ($CFL_TEST_KILL_AT_WRITE), then SIGKILL this process."""
    count[0] += 1
    if count[0] == int(os.environ.get("CFL_TEST_KILL_AT_WRITE", "0")):
        data = b"".join(bytes(b) for b in buffers)
        os.pwrite(fd, data[: len(data) // 2], offset)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(fd, buffers, offset)


disk_states._write_all = killing_write


@register
class Killer(Method):
    name = "killer"
    about = "test helper: kills the run in the middle of its N-th client-state write"
'''


@pytest.fixture
def killer_registered():
    with METHODS.temporarily("killer", type("Killer", (Method,), {"name": "killer"})):
        yield


@pytest.mark.usefixtures("killer_registered")
@pytest.mark.parametrize("kill_at", [3, 9])  # in the first task end's writes; in the second's
def test_sigkill_in_a_store_write_then_resume_gives_the_same_run(tmp_path, kill_at):
    cfg = {"stream": {"name": "split-digits", "num_tasks": 3}, "model": {"name": "mlp"}, "num_clients": 6,
           "clients_per_round": 2, "rounds_per_task": 2, "batch_size": 32, "lr": 0.05, "eval_every": 1,
           "checkpoint_every": 1, "threads": 1, "method": {"name": "ewc"}, "client_state_store": "disk",
           "wandb": {"mode": "disabled"}, "plugins": [{"name": "killer"}]}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "killer.py").write_text(KILLER)
    reference = tmp_path / "reference"
    memory = tmp_path / "memory.yaml"
    memory.write_text(yaml.safe_dump({**cfg, "client_state_store": "memory"}))
    assert main(["run", str(memory), "--out", str(reference), "--quiet"]) == 0
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CFL_TEST_KILL_AT_WRITE": str(kill_at)}
    proc = subprocess.run([sys.executable, "-m", "cfl", "run", str(tmp_path / "cfg.yaml"), "--out", str(out),
                           "--quiet", "--plugin", str(tmp_path / "killer.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / "results.json").exists()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    with open(reference / "config.yaml") as fh:  # the two runs differ only in the store
        assert {**yaml.safe_load(fh), "client_state_store": "disk"} == yaml.safe_load((out / "config.yaml").read_text())
    assert_same_outputs(out, reference)


def test_overwrite_deletes_the_store(tmp_path):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({
        "stream": {"name": "split-digits", "num_tasks": 2}, "method": {"name": "ewc"}, "num_clients": 4,
        "clients_per_round": 2, "rounds_per_task": 1, "client_state_store": "disk",
        "wandb": {"mode": "disabled"}}))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(out), "--quiet"]) == 0
    stale = out / "client_states" / "0-ewc" / "seg-099999.log"
    stale.write_bytes(b"from an earlier run")
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert not stale.exists() and any((out / "client_states").rglob("seg-*.log"))
