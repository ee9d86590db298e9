"""``keep_client_states: false``: a finished run drops its client states (disk store and checkpoint), says so,
and refuses a resume that would need them; a run that held none still resumes."""

import json

import pytest
import torch
import yaml

from cfl.app.cli import main
from cfl.engine.rounds.runner import Runner

TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 1, "batch_size": 32, "lr": 0.05, "threads": 1, "method": {"name": "ewc"},
        "wandb": {"mode": "disabled"}}


def run(tmp_path, *sets, name="run"):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    argv = ["run", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / name), "--quiet"]
    return main([*argv, *(a for s in sets for a in ("--set", s))])


def clients_in_checkpoint(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)["states"][0]["clients"]


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_finished_run_drops_its_client_states_and_says_so(tmp_path, capsys, store):
    assert run(tmp_path, f"client_state_store={store}", "keep_client_states=false") == 0
    out = tmp_path / "run"
    err = capsys.readouterr().err
    assert "keep_client_states: false: dropped 4 client states" in err and "can no longer be resumed" in err
    assert ("client_states/ (" in err) == (store == "disk")
    assert not (out / "client_states").exists()
    assert clients_in_checkpoint(out) == {"store": "dropped", "clients": 4}
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["method_stats"]["ewc"]["clients_with_state"] == 4  # computed before
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "dropped its client states (keep_client_states: false)" in err and "--overwrite" in err


def test_by_default_the_states_stay_and_a_resume_can_drop_them(tmp_path, capsys, monkeypatch):
    assert run(tmp_path, "client_state_store=disk") == 0
    out = tmp_path / "run"
    assert list((out / "client_states").rglob("seg-*.log")) and clients_in_checkpoint(out)["store"] == "disk"
    before = json.loads((out / "results.json").read_text())
    monkeypatch.setattr(Runner, "run_round", lambda *_: pytest.fail("a finished run trained again"))
    assert main(["run", "--resume", str(out), "--quiet", "--set", "keep_client_states=false"]) == 0
    assert "dropped 4 client states" in capsys.readouterr().err and not (out / "client_states").exists()
    after = json.loads((out / "results.json").read_text())
    assert after["acc_matrix"] == before["acc_matrix"] and after["method_stats"] == before["method_stats"]


def test_a_run_without_client_states_has_nothing_to_drop_and_still_resumes(tmp_path, capsys):
    assert run(tmp_path, "method.name=fedavg", "keep_client_states=false") == 0
    assert "the methods held no client state; nothing to drop" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "run"), "--quiet"]) == 0
