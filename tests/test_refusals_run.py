"""How ``cfl run`` refuses or stops around its run directory: exit code and message words, every case.

Besides the words, every case checks that a finished run next to it is untouched (its files and their
modification times), so no refusal or stop ever damages earlier results.
"""

import errno
import os
from pathlib import Path

import pytest
import yaml

import cfl.single_run
from cfl.cli import main
from cfl.engine import checkpoint, rundir
from cfl.engine.lock import locked
from cfl.engine.runner import Runner
from cfl.schema import ConfigError

TINY = {"stream": {"name": "split-digits", "num_tasks": 2}, "num_clients": 4, "clients_per_round": 2,
        "rounds_per_task": 2, "batch_size": 32, "lr": 0.05, "eval_every": 1, "checkpoint_every": 1,
        "threads": 1, "wandb": {"mode": "disabled"}}
DATA_ERROR = "no split-digits files under /nowhere (test fault)"

# (case, argv with {placeholders}, fault, exit code, words the message must contain)
CASES = [
    ("--out is a file", ["{cfg}", "--out", "{file}"], "", 2, ["--out {file}", "is a file"]),
    ("--out under a file", ["{cfg}", "--out", "{file}/run"], "", 2, ["{file} is a file", "no directory"]),
    ("--out read-only", ["{cfg}", "--out", "{readonly}/run"], "readonly", 2, ["{readonly}", "not writable"]),
    ("run directory in use", ["{cfg}", "--out", "{busy}", "--overwrite"], "lock", 2,
     ["'{busy}' is in use by another cfl run", f"pid {os.getpid()} on host", "started"]),
    ("resume while the run is going", ["--resume", "{busy}"], "lock", 2,
     ["'{busy}' is in use by another cfl run", f"pid {os.getpid()}"]),
    ("--overwrite, then a data error", ["{cfg}", "--out", "{finished}", "--overwrite"], "data", 2, [DATA_ERROR]),
    ("data error in a new directory", ["{cfg}", "--out", "{tmp}/new"], "data", 2, [DATA_ERROR]),
    ("server step diverges", ["{cfg}", "--out", "{tmp}/diverged", "--set", "server_lr=1.0e39"], "", 3,
     ["non-finite global model after the server step", "round 1 of the task", "every client update was finite",
      "lower server_lr (now 1e+39)", "aggregator (mean)", "after round 0"]),
    ("server optimiser diverges", ["{cfg}", "--out", "{tmp}/adam", "--set",
                                   "method={{name: fedadam, server_lr: 1.0e39}}"], "", 3,
     ["after the server step", "server optimiser of fedadam"]),
    ("disk full", ["{cfg}", "--out", "{tmp}/full"], "disk", 4,
     ["disk full (OSError 28", "while writing {tmp}/full", "after round 2", "still valid", "free some space",
      "cfl run --resume {tmp}/full"]),
    ("disk full before the first round", ["{cfg}", "--out", "{tmp}/full0"], "disk0", 4,
     ["disk full (OSError 28", "config.yaml", "nothing was trained"]),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refusals_run")
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (tmp / "afile").write_text("not a directory")
    (tmp / "readonly").mkdir()
    assert main(["run", str(tmp / "tiny.yaml"), "--out", str(tmp / "finished"), "--quiet"]) == 0
    (tmp / "busy").mkdir()
    (tmp / "busy" / "config.yaml").write_text((tmp / "finished" / "config.yaml").read_text())
    checkpoint.save(tmp / "busy", checkpoint.load(tmp / "finished"))
    return {"tmp": str(tmp), "cfg": str(tmp / "tiny.yaml"), "file": str(tmp / "afile"),
            "readonly": str(tmp / "readonly"), "finished": str(tmp / "finished"), "busy": str(tmp / "busy")}


def fail_writes_after_round(monkeypatch, after_round: int) -> None:
    """Every fsync raises ENOSPC once round ``after_round`` has trained (0: from the start)."""
    real_fsync, real_round = os.fsync, Runner.run_round
    state = {"full": after_round == 0}

    def fsync(fd):
        if state["full"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    def run_round(self, task, rnd):
        record = real_round(self, task, rnd)
        state["full"] |= record["round"] > after_round
        return record

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Runner, "run_round", run_round)


def apply_fault(fault: str, files: dict, monkeypatch, stack) -> None:
    if fault == "data":
        def load_stream(*_, **__):
            raise ConfigError(DATA_ERROR)
        monkeypatch.setattr(cfl.single_run, "load_stream", load_stream)
    elif fault == "lock":
        stack.enter_context(locked(Path(files["busy"])))
    elif fault == "readonly":
        os.chmod(files["readonly"], 0o555)
        stack.callback(os.chmod, files["readonly"], 0o755)
        real_access = os.access  # root may write anywhere: let the check see the mode bits
        monkeypatch.setattr(rundir.os, "access", lambda p, m: Path(p) != Path(files["readonly"]) and real_access(p, m))
    elif fault in ("disk", "disk0"):
        fail_writes_after_round(monkeypatch, 2 if fault == "disk" else 0)


def snapshot(run_dir: str) -> dict:
    """Every output file and its (mtime, size); the lock file records each later holder and is left out."""
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in Path(run_dir).iterdir() if p.name != ".cfl.lock"}


def test_the_table_covers_every_fault():
    assert {c[2] for c in CASES} == {"", "data", "lock", "readonly", "disk", "disk0"}
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "fault", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refusal_or_stop(argv, fault, code, words, files, monkeypatch, capsys):
    from contextlib import ExitStack

    before = snapshot(files["finished"])
    with ExitStack() as stack:
        apply_fault(fault, files, monkeypatch, stack)
        got = main(["run", *[a.format(**files) for a in argv], "--quiet"])
    err = capsys.readouterr().err
    assert got == code, err
    for word in words:
        assert word.format(**files) in err, err
    assert "Traceback" not in err
    assert snapshot(files["finished"]) == before  # the finished run is untouched


def test_overwrite_replaces_only_after_a_successful_build(files):
    """--overwrite with a data error keeps the old run; without the error it replaces it."""
    out = Path(files["tmp"]) / "replaced"
    assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 0
    old = (out / "results.json").read_text()
    with pytest.MonkeyPatch.context() as mp:
        apply_fault("data", files, mp, None)
        assert main(["run", files["cfg"], "--out", str(out), "--overwrite", "--quiet", "--set", "seed=1"]) == 2
    assert (out / "results.json").read_text() == old and (out / "checkpoint.pt").is_file()
    assert main(["run", files["cfg"], "--out", str(out), "--overwrite", "--quiet", "--set", "seed=1"]) == 0
    assert (out / "results.json").read_text() != old


def test_a_run_that_failed_before_its_first_round_blocks_nothing(files):
    out = Path(files["tmp"]) / "fixed"
    with pytest.MonkeyPatch.context() as mp:
        apply_fault("data", files, mp, None)
        assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 2
    assert not out.exists()
    out.mkdir()  # an existing empty directory is kept, and left as it was
    with pytest.MonkeyPatch.context() as mp:
        apply_fault("data", files, mp, None)
        assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 2
    assert [p.name for p in out.iterdir()] == [".cfl.lock"]
    assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 0  # the fixed re-run goes ahead


def test_after_a_full_disk_the_checkpoint_is_valid_and_resume_finishes(files):
    out = Path(files["tmp"]) / "full-then-resumed"
    with pytest.MonkeyPatch.context() as mp:
        fail_writes_after_round(mp, 2)
        assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 4
    assert checkpoint.load(out)["progress"]["global_round"] == 2
    assert not list(out.glob(".checkpoint.pt.*")) and not (out / "results.json").exists()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    finished = Path(files["finished"])
    assert (out / "metrics.jsonl").read_text() == (finished / "metrics.jsonl").read_text()


def test_the_lock_is_released_when_the_run_ends(files):
    out = Path(files["tmp"]) / "released"
    assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 0
    with locked(out):  # would refuse if the finished run still held it
        pass
    assert "pid" in (out / ".cfl.lock").read_text()


def test_a_second_process_is_refused_while_a_run_holds_the_directory_and_not_after_it_was_killed(files, capsys):
    import signal
    import subprocess
    import sys
    import time

    from cfl.methods import METHODS
    from cfl.methods.base import Method
    from tests.test_resume import SLOW_PLUGIN

    tmp = Path(files["tmp"])
    (tmp / "slow.py").write_text(SLOW_PLUGIN)
    out = tmp / "held"
    cmd = [sys.executable, "-m", "cfl", "run", files["cfg"], "--out", str(out), "--quiet", "--plugin",
           str(tmp / "slow.py"), "--set", "plugins=[{name: slow}]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CFL_TEST_ROUND_SLEEP": "2"}  # killed long before its end
    with METHODS.temporarily("slow", type("Slow", (Method,), {"name": "slow"})):  # the plugin's name, here too
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not (out / "checkpoint.pt").is_file() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            for argv in (["run", files["cfg"], "--out", str(out), "--overwrite"], ["run", "--resume", str(out)]):
                assert main([*argv, "--quiet"]) == 2
                err = capsys.readouterr().err
                assert f"is in use by another cfl run (pid {proc.pid} on host" in err, err
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        assert main(["run", "--resume", str(out), "--quiet"]) == 0  # the kernel released the dead run's lock
