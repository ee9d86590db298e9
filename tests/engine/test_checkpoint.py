"""Checkpoints in process: generators, atomic writes, exact resume for every method, non-finite stops."""

import os
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from cfl.app.cli import main
from cfl.app.single_run import keep_metrics_lines
from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import TRAINERS, Runner
from cfl.engine.stores import checkpoint
from cfl.methods import METHODS
from tests.conftest import make_stream, method_spec, stream_for, tiny_config


def test_rng_state_round_trip_restores_every_generator():
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    state = checkpoint.rng_state()
    first = (torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)])
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    checkpoint.set_rng_state(state)
    again = (torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)])
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_save_replaces_atomically_and_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, {"x": torch.arange(3)})
    real_fsync = os.fsync

    def crash(_fd):
        raise OSError("disk died mid-write")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="mid-write"):
        checkpoint.save(tmp_path, {"x": torch.arange(5)})
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left behind
    assert torch.equal(torch.load(tmp_path / "checkpoint.pt", weights_only=True)["x"], torch.arange(3))


def test_a_half_written_temp_file_from_a_killed_process_is_ignored(tmp_path):
    runner = Runner(tiny_config(), make_stream())
    checkpoint.save(tmp_path, checkpoint.capture(runner.snapshot(), "wb-1"))
    (tmp_path / ".checkpoint.pt.k1ll3d").write_bytes(b"PK\x03\x04 truncated")  # SIGKILL before os.replace
    payload = checkpoint.load(tmp_path)
    assert payload["wandb_run_id"] == "wb-1" and payload["progress"]["global_round"] == 0
    checkpoint.remove_stale_temp_files(tmp_path)  # what a resume does
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_damaged_or_missing_checkpoint_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint.pt"):
        checkpoint.load(tmp_path)
    (tmp_path / "checkpoint.pt").write_bytes(b"not a zip file")
    with pytest.raises(ConfigError, match="unreadable"):
        checkpoint.load(tmp_path)
    torch.save({"format": 99}, tmp_path / "checkpoint.pt")
    with pytest.raises(ConfigError, match="not a cfl checkpoint"):
        checkpoint.load(tmp_path)
    torch.save({"format": checkpoint.FORMAT - 1}, tmp_path / "checkpoint.pt")
    with pytest.raises(ConfigError, match="written by an older cfl.*--overwrite"):
        checkpoint.load(tmp_path)


def test_method_state_that_would_need_unsafe_unpickling_is_refused_by_name():
    runner = Runner(tiny_config(), make_stream())
    runner.states[0].clients.put(2, {"basis": np.zeros(3)})
    with pytest.raises(checkpoint.CheckpointError, match=r"method 'fedavg'.*\[2\].*'basis'.*ndarray"):
        checkpoint.capture(runner.snapshot(), None)


def test_edited_config_is_refused_but_result_neutral_keys_may_change():
    cfg = tiny_config()
    saved = cfg.to_dict()
    checkpoint.check_config(saved, replace(cfg, threads=1, checkpoint_every=3), Path("run"))
    with pytest.raises(ConfigError, match=r"lr: 0.05 in the checkpoint, 0.1 now"):
        checkpoint.check_config(saved, replace(cfg, lr=0.1), Path("run"))
    with pytest.raises(ConfigError, match=r"method.mu"):
        checkpoint.check_config(saved, replace(cfg, method={"name": "fedavg", "mu": 1.0}), Path("run"))


def test_metrics_file_is_cut_back_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = ['{"kind": "round", "round": 1}\n', '{"kind": "evaluation", "round": 2}\n',
             '{"kind": "round", "round": 2}\n', '{"kind": "evaluation", "round": 2}\n',
             '{"kind": "round", "round": 3}\n', '{"kind": "ro']
    path.write_text("".join(lines))  # checkpoint after round 2 and its task-end evaluation; round 3 after it, torn
    keep_metrics_lines(path, 2, [{"round": 2}, {"round": 2}])
    assert path.read_text() == "".join(lines[:4])
    path.write_text("")  # lost lines: the evaluations are rebuilt from the checkpoint, with a warning
    with pytest.warns(UserWarning, match="per-round lines up to round 1 are lost"):
        keep_metrics_lines(path, 1, [{"round": 1}])
    assert path.read_text() == '{"kind": "evaluation", "round": 1}\n'


def run_to_end(cfg, stream, stop_after=None, payload=None, state_dir=None):
    """A fresh runner, optionally restored from ``payload`` or stopped after global round ``stop_after``
    (``state_dir``: where a disk client-state store keeps its files)."""
    torch.manual_seed(12345)  # whatever the process did before must not matter
    runner = Runner(cfg, stream, state_dir=state_dir)
    if payload is not None:
        runner.resume(checkpoint.restore(runner.snapshot(), payload))
    if stop_after is not None:
        runner.should_stop = lambda: runner.progress.global_round >= stop_after
    runner.run()
    return runner


def assert_same_run(a, b):
    assert a.progress.acc_matrix == b.progress.acc_matrix
    assert a.progress.evaluations == b.progress.evaluations
    assert a.comm.state_dict() == b.comm.state_dict()
    for k, tensor in a.shared_backbone.frozen.items():  # a shared frozen backbone a method changed
        assert torch.equal(tensor, b.shared_backbone.frozen[k]), f"{k}: the resumed run's backbone differs"
    for k in a.params:
        assert torch.equal(a.params[k], b.params[k]), (
            f"{k}: the resumed run differs from the uninterrupted one; some state outside the checkpoint "
            f"(e.g. an engine cache kept per model across rounds) changes the numerics")


def resumed(cfg, stream, stop_after, tmp_path):
    half = run_to_end(cfg, stream, stop_after=stop_after)
    checkpoint.save(tmp_path, checkpoint.capture(half.snapshot(), None))
    return run_to_end(cfg, stream, payload=checkpoint.load(tmp_path))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_resumes_bit_for_bit(name, tmp_path):
    cfg = tiny_config(method=method_spec(name), eval_every=1, rounds_per_task=3, num_clients=4, clients_per_round=3)
    stream = stream_for(name, num_tasks=2)
    # stopped in task 2, after the task-end hooks of task 1 filled the client and server states
    assert_same_run(run_to_end(cfg, stream), resumed(cfg, stream, 4, tmp_path))


DROPOUT_CFG = tiny_config(model={"name": "mlp"}, eval_every=2)
DROPOUT_STREAM = make_stream(num_tasks=2, dim=8)


@pytest.fixture(scope="module")
def dropout_reference():
    return run_to_end(DROPOUT_CFG, DROPOUT_STREAM)


@pytest.mark.parametrize("stop_after", [0, 2, 3, 5])
def test_dropout_model_resumes_bit_for_bit_at_any_round(stop_after, dropout_reference, tmp_path):
    assert_same_run(dropout_reference, resumed(DROPOUT_CFG, DROPOUT_STREAM, stop_after, tmp_path))


def test_without_the_generator_state_dropout_differs(dropout_reference):
    """The check above has teeth: restoring everything but torch's generator changes the dropout masks."""
    half = run_to_end(DROPOUT_CFG, DROPOUT_STREAM, stop_after=1)
    payload = checkpoint.capture(half.snapshot(), None)
    payload["rng"] = {**payload["rng"], "torch": torch.manual_seed(7).get_state()}
    other = run_to_end(DROPOUT_CFG, DROPOUT_STREAM, payload=payload)
    assert not torch.equal(other.params["head.weight"], dropout_reference.params["head.weight"])


TINY_YAML = """stream: {name: split-digits, num_tasks: 2}
num_clients: 4
clients_per_round: 2
rounds_per_task: 3
batch_size: 16
lr: 0.05
checkpoint_every: 1
threads: 1
wandb: {mode: disabled}
"""


def poison_round(monkeypatch, at_round, client_row=1):
    """Make one client's trained parameters NaN in global round ``at_round`` (1-based)."""
    make_real = TRAINERS["batched"]
    calls = {"n": 0}
    real = make_real()

    def trainer(*args, **kwargs):
        trained, outcomes = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == at_round:
            trained = {k: v.clone() for k, v in trained.items()}
            next(iter(trained.values()))[client_row] = float("nan")
        return trained, outcomes

    monkeypatch.setitem(TRAINERS, "batched", lambda: trainer)


def test_non_finite_update_stops_with_exit_3_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(TINY_YAML)
    poison_round(monkeypatch, at_round=3)
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "non-finite" in err and "task 0 (0-based), round 3" in err and "client(s) [" in err
    assert "checkpoint (after round 2) is kept" in err
    saved = checkpoint.load(tmp_path / "run")
    assert saved["progress"]["global_round"] == 2
    assert all(torch.isfinite(v).all() for v in saved["params"].values())
    assert not (tmp_path / "run" / "results.json").exists()
    # recover: resume, dropping the bad client's update this time (round 3 is the resumed run's first)
    poison_round(monkeypatch, at_round=1)
    with pytest.warns(UserWarning, match="round 3 of the task.*update dropped"):
        code = main(["run", "--resume", str(tmp_path / "run"), "--quiet", "--set", "on_nonfinite=skip_client"])
    assert code == 0 and (tmp_path / "run" / "results.json").is_file()


def test_skip_client_drops_the_bad_update_and_finishes(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text(TINY_YAML)
    poison_round(monkeypatch, at_round=3)
    with pytest.warns(UserWarning, match="update dropped"):
        code = main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet", "--set",
                     "on_nonfinite=skip_client"])
    assert code == 0 and (tmp_path / "run" / "results.json").is_file()


def test_a_diverging_learning_rate_is_caught(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(TINY_YAML)
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet", "--set", "lr=1.0e+30"]) == 3
    assert "lower lr (now 1e+30)" in capsys.readouterr().err
    assert checkpoint.load(tmp_path / "run")["progress"]["global_round"] == 0
