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

from cfl.app.cli import main
from cfl.engine.rounds.runner import Runner
from cfl.methods import METHODS
from cfl.methods.base import Method
from tests.helpers import metrics_values

# the FOT MLP (dropout 0.2/0.5/0.5) on digits: resuming must restore torch's generator too
TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "model": {"name": "mlp"}, "num_clients": 4,
        "clients_per_round": 2, "rounds_per_task": 3, "batch_size": 32, "lr": 0.05, "eval_every": 1,
        "checkpoint_every": 1, "threads": 1, "wandb": {"mode": "disabled"}, "plugins": [{"name": "slow"}]}

SLOW_PLUGIN = '''
import os, time
from cfl.methods import register
from cfl.methods.base import Method, Sends


@register
class Slow(Method):
    name = "slow"
    about = "test helper: FedAvg that sleeps $CFL_TEST_ROUND_SLEEP seconds per round (a window to kill in)"

    sends = Sends(server_events=("round", "task_end"))

    def server_event(self, ctx):
        time.sleep(float(os.environ.get("CFL_TEST_ROUND_SLEEP", "0")))
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The config and plugin files, and the uninterrupted run (in process, no sleeping)."""
    root = tmp_path_factory.mktemp("resume")
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (root / "tiny-bf16.yaml").write_text(yaml.safe_dump({**TINY, "precision": "bf16-mixed"}))
    (root / "slow.py").write_text(SLOW_PLUGIN)
    namespace: dict = {}
    exec(SLOW_PLUGIN.replace("@register\n", ""), namespace)
    with METHODS.temporarily("slow", namespace["Slow"]):
        assert main(["run", str(root / "tiny.yaml"), "--out", str(root / "reference"), "--quiet"]) == 0
        assert main(["run", str(root / "tiny-bf16.yaml"), "--out", str(root / "reference-bf16"), "--quiet"]) == 0
    return root


@pytest.fixture
def slow_registered():
    """The plugin's method name in this process (a stand-in class: resuming needs the name; the sleeping runs
    are killed in other processes)."""
    with METHODS.temporarily("slow", type("Slow", (Method,), {"name": "slow"})):
        yield


def outputs(run_dir: Path) -> tuple:
    results = json.loads((run_dir / "results.json").read_text())
    params = torch.load(run_dir / "checkpoint.pt", weights_only=True)["params"]
    return results["acc_matrix"], metrics_values(run_dir / "metrics.jsonl"), params


def assert_same_outputs(run_dir: Path, reference: Path) -> None:
    matrix, metrics, params = outputs(run_dir)
    ref_matrix, ref_metrics, ref_params = outputs(reference)
    assert matrix == ref_matrix  # floats compared exactly
    assert metrics == ref_metrics  # every line once, in order, identical but for its timings
    assert all(torch.equal(params[k], ref_params[k]) for k in ref_params)


def saved_round(run_dir: Path) -> int:
    try:
        return torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]["global_round"]
    except (FileNotFoundError, RuntimeError, EOFError):
        return -1


@pytest.mark.usefixtures("slow_registered")
@pytest.mark.parametrize("config", ["tiny", "tiny-bf16"])
def test_sigkill_at_any_moment_then_resume_gives_the_same_run(setup, config):
    """Also in bf16-mixed: its bfloat16 products are as deterministic as float32's."""
    out = setup / f"killed-{config}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CFL_TEST_ROUND_SLEEP": "0.8"}
    cmd = [sys.executable, "-m", "cfl", "run", str(setup / f"{config}.yaml"), "--out", str(out), "--quiet",
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
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert_same_outputs(out, setup / config.replace("tiny", "reference"))
    if config == "tiny-bf16":  # the bf16 run is its own: its products differ from float32's
        assert outputs(out)[1] != outputs(setup / "reference")[1]


def stop_with(monkeypatch, signum: int, after_round: int) -> None:
    """Deliver ``signum`` to this process during global round ``after_round`` (1-based)."""
    real = Runner.run_round

    def run_round(self, task, rnd):
        record = real(self, task, rnd)
        if record["round"] == after_round:
            signal.raise_signal(signum)
        return record

    monkeypatch.setattr(Runner, "run_round", run_round)


@pytest.mark.usefixtures("slow_registered")
@pytest.mark.parametrize(("signum", "code", "after_round"), [(signal.SIGINT, 130, 2), (signal.SIGTERM, 143, 4)])
def test_signal_stops_after_the_round_with_a_checkpoint_and_resume_finishes(setup, monkeypatch, capsys,
                                                                            signum, code, after_round):
    out = setup / f"stopped-{signum}"
    stop_with(monkeypatch, signum, after_round)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the tests run in a background job
    assert main(["run", str(setup / "tiny.yaml"), "--out", str(out), "--quiet"]) == code
    err = capsys.readouterr().err
    assert f"stopped by {signal.Signals(signum).name} after round {after_round}" in err
    assert f"cfl run --resume {out}" in err
    assert saved_round(out) == after_round and not (out / "results.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # handlers are put back
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert_same_outputs(out, setup / "reference")


@pytest.mark.usefixtures("slow_registered")
def test_resuming_a_finished_run_rebuilds_its_outputs_without_training(setup, monkeypatch):
    out = setup / "reference"
    before = outputs(out)
    monkeypatch.setattr(Runner, "run_round", lambda *_: pytest.fail("a finished run trained again"))
    assert main(["run", "--resume", str(out), "--quiet", "--set", "threads=2"]) == 0
    after = outputs(out)
    assert after[0] == before[0] and after[1] == before[1]
    assert yaml.safe_load((out / "config.yaml").read_text())["threads"] == 2  # result-neutral key updated


# stopped in task 1 (round 4 of 6): the task-end states, the class mask and the aggregator state all restored
VARIANTS = {
    "gma": {"aggregator": {"name": "gma", "tau": 0.5}},
    "tce": {"loss": "tce", "partition": {"name": "shards"}},
    "class-incremental": {"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "class"}},
    # GLFC: the memory, the proxy's monitor set, best and old models, the round counter; small settings
    "glfc": {"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "class"},
             "method": {"name": "glfc", "memory_size": 10, "perturb_steps": 1, "reconstruction_steps": 1,
                        "reconstructions_kept": 1, "reconstruction_iterations": 2}},
    # GLFC's task-incremental adaptation: the learned mask and monitor labels by global class id
    "glfc-task": {"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "task"},
                  "method": {"name": "glfc", "memory_size": 10, "perturb_steps": 1, "reconstruction_steps": 1,
                             "reconstructions_kept": 1, "reconstruction_iterations": 2}},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_stopped_then_resumed_run_is_identical_for_gma_tce_class_incremental_and_glfc(tmp_path, monkeypatch, variant):
    cfg = {**{k: v for k, v in TINY.items() if k != "plugins"}, **VARIANTS[variant]}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "reference"), "--quiet"]) == 0
    stop_with(monkeypatch, signal.SIGINT, 4)
    out = tmp_path / "stopped"
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(out), "--quiet"]) == 130
    assert saved_round(out) == 4 and not (out / "results.json").exists()
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert_same_outputs(out, tmp_path / "reference")


def test_augmented_stream_resumes_bit_for_bit(tmp_path):
    """Crop-and-flip draws come from torch's generator, which the checkpoint carries (Mini-ImageNet's
    augmentation, here on 8x8 one-channel blobs)."""
    from cfl.data.augment import CropFlip
    from cfl.engine.stores import checkpoint
    from cfl.validation import from_dict
    from tests.conftest import make_stream

    stream = make_stream("task", dim=64)
    for task in stream.tasks:
        task.train_x, task.test_x = task.train_x.view(-1, 1, 8, 8), task.test_x.view(-1, 1, 8, 8)
    stream.input_shape, stream.augment = (1, 8, 8), CropFlip(2, torch.tensor([-0.5]))
    # digits-mlp has no dropout: the augmentation is the only draw from torch's generator
    cfg = from_dict({"num_clients": 3, "clients_per_round": 2, "rounds_per_task": 3, "batch_size": 7, "lr": 0.1,
                     "model": {"name": "digits-mlp"}, "wandb": {"mode": "disabled"}})
    reference = Runner(cfg, stream)
    reference.run()

    stopped = Runner(cfg, stream)
    stopped.should_stop = lambda: stopped.progress.global_round == 4
    stopped.run()
    assert stopped.progress.global_round == 4
    checkpoint.save(tmp_path, checkpoint.capture(stopped.snapshot(), None))
    torch.manual_seed(123)  # whatever ran in between
    resumed = Runner(cfg, stream)
    resumed.resume(checkpoint.restore(resumed.snapshot(), checkpoint.load(tmp_path)))
    resumed.run()
    assert resumed.progress.acc_matrix == reference.progress.acc_matrix
    assert all(torch.equal(resumed.params[k], reference.params[k]) for k in reference.params)


@pytest.mark.usefixtures("slow_registered")
def test_a_resumed_run_says_it_resumed_and_from_which_round(setup, monkeypatch, capsys):
    out = setup / "said-resumed"
    stop_with(monkeypatch, signal.SIGINT, 2)
    assert main(["run", str(setup / "tiny.yaml"), "--out", str(out), "--quiet"]) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"cfl: resumed {out} from its checkpoint after global round 2 (" in err, err
    assert_same_outputs(out, setup / "reference")


@pytest.mark.usefixtures("slow_registered")
def test_results_json_names_the_round_of_each_resume_and_none_for_a_run_never_stopped(setup, monkeypatch):
    """``resumed_after_rounds``: the checkpoints' global rounds, kept through a second stop; the run's history, not
    its results (benchmarks/bit_for_bit.py drops it), so the twice-resumed run still equals the reference."""
    out = setup / "resumed-twice"
    stop_with(monkeypatch, signal.SIGINT, 2)
    assert main(["run", str(setup / "tiny.yaml"), "--out", str(out), "--quiet"]) == 130
    monkeypatch.undo()
    stop_with(monkeypatch, signal.SIGINT, 4)
    assert main(["run", "--resume", str(out), "--quiet"]) == 130
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["resumed_after_rounds"] == [2, 4]
    # the bf16 reference: never resumed ("reference" is, by the test of a finished run's resume)
    assert json.loads((setup / "reference-bf16" / "results.json").read_text())["resumed_after_rounds"] == []
    assert_same_outputs(out, setup / "reference")
