"""How ``cfl run`` refuses or stops around its run directory: exit code and message words, every case.

Besides the words, every case checks that a finished run next to it is untouched (its files and their
modification times), so no refusal or stop ever damages earlier results.
"""

import errno
import json
import os
from pathlib import Path

import pytest
import yaml

import cfl.app.single_run
from cfl.app.cli import main
from cfl.config.schema import ConfigError
from cfl.engine.rounds.runner import Runner
from cfl.engine.stores import checkpoint, rundir
from cfl.engine.stores.lock import locked
from tests.helpers import metrics_values

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
    # the adaptive server's own server_lr is bounded (cfl/methods/bounds.py, LR_MAX), so the
    # server step of fedadam diverging at 1e39 is now refused before any work
    ("server optimiser lr beyond its bound", ["{cfg}", "--out", "{tmp}/adam", "--set",
                                              "method={{name: fedadam, server_lr: 1.0e39}}"], "", 2,
     ["'method.server_lr'", "<= 10.0"]),
    ("disk full", ["{cfg}", "--out", "{tmp}/full"], "disk", 4,
     ["disk full (OSError 28", "while writing {tmp}/full", "after round 2", "still valid", "free some space",
      "cfl run --resume {tmp}/full"]),
    ("disk full before the first round", ["{cfg}", "--out", "{tmp}/full0"], "disk0", 4,
     ["disk full (OSError 28", "{tmp}/full0/.cfl-run", "nothing was trained"]),  # the marker: written first
]

# ---- run directories, the lock, the disk client-state store, file-system faults ----
STATE_ERROR = ["client_states/0-ewc/seg-", "the record of client", "is damaged", "checksum mismatch",
               "named by the checkpoint (after round 4)"]
CASES += [
    ("--overwrite of a directory cfl did not make", ["{cfg}", "--out", "{user}", "--overwrite"], "", 2,
     ["--overwrite: '{user}' holds files but is not a cfl run directory", "nothing in it is deleted",
      "touch {user}/.cfl-run"]),
    ("lock file is a symbolic link", ["{cfg}", "--out", "{linked}"], "", 2,
     ["{linked}/.cfl.lock is a symbolic link", "does not follow it", "Remove the link"]),
    ("lock file is a hard link", ["{cfg}", "--out", "{hardlinked}"], "", 2,
     ["{hardlinked}/.cfl.lock has 2 hard links", "Remove {hardlinked}/.cfl.lock"]),
    ("lock file deleted mid-run", ["{cfg}", "--out", "{tmp}/lost"], "lock deleted", 3,
     ["{tmp}/lost/.cfl.lock was deleted while this run held it", "another cfl run may be using",
      "last checkpoint (after round 1)", "make sure no other cfl run uses the directory"]),
    ("lock file replaced mid-run", ["{cfg}", "--out", "{tmp}/replaced-lock"], "lock replaced", 3,
     ["{tmp}/replaced-lock/.cfl.lock was replaced by another file", "after round 1"]),
    ("client state: a flipped bit", ["--resume", "{tmp}/flip"], "state flip", 2, STATE_ERROR),
    ("client state: a scaled value", ["--resume", "{tmp}/scale"], "state scale", 2, STATE_ERROR),
    ("client state: a damaged header", ["--resume", "{tmp}/header"], "state header", 2, STATE_ERROR),
    ("resume with read-only client_states", ["--resume", "{tmp}/ro-states"], "states read-only", 2,
     ["{tmp}/ro-states/client_states is not writable", "chmod -R u+w {tmp}/ro-states/client_states"]),
    ("--out under an unsearchable directory", ["{cfg}", "--out", "{tmp}/closed/run"], "unsearchable", 2,
     ["--out {tmp}/closed/run: cannot look inside {tmp}/closed", "no search permission"]),
    ("binary W&B sweep parameter file", ["{cfg}"], "binary params", 2,
     ["W&B sweep parameter file '{tmp}/params.bin'", "is not UTF-8 text", "WANDB_SWEEP_PARAM_PATH"]),
]
# ---- a finished run that dropped its client states (keep_client_states: false) ----
CASES += [
    ("resume a run that dropped its client states", ["--resume", "{tmp}/dropped"], "states dropped", 2,
     ["--resume {tmp}/dropped: this run finished and dropped its client states (keep_client_states: false)",
      "its outputs (results.json) are complete", "--overwrite and keep_client_states: true"]),
]
# ---- a marker that is a directory is no marker (--overwrite ended in IsADirectoryError) ----
CASES += [
    ("marker is a directory, --overwrite", ["{cfg}", "--out", "{tmp}/marker-dir", "--overwrite"], "marker dir", 2,
     ["{tmp}/marker-dir/.cfl-run is a directory", "nothing in it is deleted", "rmdir {tmp}/marker-dir/.cfl-run"]),
    ("marker is a directory, with outputs", ["{cfg}", "--out", "{tmp}/marker-dir-out", "--overwrite"], "marker dir",
     2, ["{tmp}/marker-dir-out/.cfl-run is a directory", "move {tmp}/marker-dir-out/.cfl-run away"]),
]
# ---- a checkpoint changed after cfl wrote it, and one of another model ----
CASES += [
    ("checkpoint with edited weights", ["--resume", "{tmp}/edited"], "ckpt edited", 2,
     ["--resume {tmp}/edited: {tmp}/edited/checkpoint.pt was changed after cfl wrote it", "SHA-256",
      "restore the file cfl wrote"]),
    ("checkpoint of another model", ["--resume", "{tmp}/reshaped"], "ckpt reshaped", 2,
     ["the checkpoint's model parameter", "has shape (5, 64), this run's model has",
      "the checkpoint is of another model"]),
]
FS_FAULTS = {"lock deleted", "lock replaced", "state flip", "state scale", "state header", "states read-only",
             "unsearchable", "binary params", "states dropped", "marker dir", "ckpt edited", "ckpt reshaped"}
DISK_TINY = {**TINY, "method": {"name": "ewc"}, "client_state_store": "disk"}


def damage_record(run_dir: Path, kind: str) -> None:
    """Change the first client-state record the checkpoint names: a bit of its data, a float32 value x2, or a
    byte of its JSON header (cfl.engine.stores.state_codec's layout: 12-byte prefix, header, data at 64 bytes)."""
    import struct

    from cfl.engine.stores.disk_states import _segment_name

    seg, offset, _, _ = checkpoint.load(run_dir)["states"][0]["clients"]["records"][0].tolist()
    path = next((run_dir / rundir.CLIENT_STATES).glob(f"*/{_segment_name(seg)}"))
    raw = bytearray(path.read_bytes())
    header = struct.unpack_from("<I", raw, offset + 8)[0]
    data = offset + 12 + header + (-(12 + header) % 64)
    if kind == "flip":
        raw[data + 2] ^= 0x10
    elif kind == "scale":
        struct.pack_into("<f", raw, data, 2 * struct.unpack_from("<f", raw, data)[0])
    else:
        raw[offset + 12 + header // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def lose_lock_in_round(monkeypatch, how: str, round_: int = 2) -> None:
    """Delete or replace the run's .cfl.lock once round ``round_`` has trained (another process could then
    lock the directory)."""
    real_round = Runner.run_round

    def run_round(self, task, rnd):
        record = real_round(self, task, rnd)
        if record["round"] == round_:
            lock = next(Path(o.run_dir) for o in self.observers if hasattr(o, "run_dir")) / ".cfl.lock"
            if how == "deleted":
                lock.unlink()
            else:
                lock.with_name("other").write_text("another run's lock")
                os.replace(lock.with_name("other"), lock)
        return record

    monkeypatch.setattr(Runner, "run_round", run_round)


def deny_access(monkeypatch, path: str, mode: int) -> None:
    """os.access as a user without ``mode`` on ``path`` (root passes every permission check, so the check
    would not see the mode bits the case sets; tests/engine/test_fs_permissions.py runs the same as a real user)."""
    real_access = os.access
    monkeypatch.setattr(rundir.os, "access", lambda p, m: not (Path(p) == Path(path) and m & mode)
                        and real_access(p, m))


def apply_fs_fault(fault: str, files: dict, monkeypatch, stack) -> None:
    import shutil

    tmp = Path(files["tmp"])
    if fault.startswith("lock "):
        lose_lock_in_round(monkeypatch, fault.split()[1])
    elif fault.startswith("state "):
        kind = fault.split()[1]
        shutil.copytree(files["disk"], tmp / kind)
        damage_record(tmp / kind, kind)
    elif fault == "states dropped":  # the finished disk-store run, resumed only to drop its states
        shutil.copytree(files["disk"], tmp / "dropped")
        assert main(["run", "--resume", str(tmp / "dropped"), "--quiet", "--set", "keep_client_states=false"]) == 0
    elif fault == "states read-only":
        shutil.copytree(files["disk"], tmp / "ro-states")
        os.chmod(tmp / "ro-states" / "client_states", 0o555)
        stack.callback(os.chmod, tmp / "ro-states" / "client_states", 0o755)
        deny_access(monkeypatch, str(tmp / "ro-states" / "client_states"), os.W_OK)
    elif fault == "unsearchable":
        (tmp / "closed").mkdir(exist_ok=True)
        os.chmod(tmp / "closed", 0o600)
        stack.callback(os.chmod, tmp / "closed", 0o755)
        deny_access(monkeypatch, str(tmp / "closed"), os.X_OK)
    elif fault.startswith("ckpt "):  # weights scaled by 1.01 behind cfl's back; a first layer of other width
        import torch

        out = tmp / ("edited" if fault == "ckpt edited" else "reshaped")
        shutil.copytree(files["finished"], out)
        payload = torch.load(out / "checkpoint.pt", weights_only=True)
        name = next(iter(payload["params"]))
        if fault == "ckpt edited":
            payload["params"][name] = payload["params"][name] * 1.01
            torch.save(payload, out / "checkpoint.pt")
        else:
            payload["params"][name] = torch.zeros(5, 64)
            checkpoint.save(out, payload)  # a well-formed checkpoint, of another model
    elif fault == "marker dir":  # an empty .cfl-run folder alone, and one holding a file beside config.yaml
        (tmp / "marker-dir" / ".cfl-run").mkdir(parents=True, exist_ok=True)
        (tmp / "marker-dir-out" / ".cfl-run").mkdir(parents=True, exist_ok=True)
        (tmp / "marker-dir-out" / ".cfl-run" / "x").write_text("a user's file")
        (tmp / "marker-dir-out" / "config.yaml").write_text("a user's file")
    elif fault == "binary params":
        (tmp / "params.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
        monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(tmp / "params.bin"))


def make_fs_files(tmp: Path) -> dict:
    """A user's own project directory, directories whose lock file is a link, and a finished disk-store run."""
    user = tmp / "project"
    for name in ("wandb/run-1", "client_states/0-ewc"):
        (user / name).mkdir(parents=True)
    for name in ("config.yaml", "results.json", "wandb/run-1/files.txt", "client_states/0-ewc/seg-000001.log"):
        (user / name).write_text(f"the user's own {name}")
    (tmp / "victim.txt").write_text("a file the lock must never touch")
    for name in ("linked", "hardlinked"):
        (tmp / name).mkdir()
    (tmp / "linked" / ".cfl.lock").symlink_to(tmp / "victim.txt")
    os.link(tmp / "victim.txt", tmp / "hardlinked" / ".cfl.lock")
    (tmp / "disk.yaml").write_text(yaml.safe_dump(DISK_TINY))
    assert main(["run", str(tmp / "disk.yaml"), "--out", str(tmp / "disk"), "--quiet"]) == 0
    return {"user": str(user), "linked": str(tmp / "linked"), "hardlinked": str(tmp / "hardlinked"),
            "disk": str(tmp / "disk")}


def tree(path: str) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in Path(path).rglob("*") if p.is_file()}


def test_overwrite_and_links_leave_the_users_files_as_they_were(files):
    before = tree(files["user"]), (Path(files["tmp"]) / "victim.txt").read_text()
    for out in (files["user"], files["linked"], files["hardlinked"]):
        assert main(["run", files["cfg"], "--out", out, "--overwrite", "--quiet"]) == 2
    assert (tree(files["user"]), (Path(files["tmp"]) / "victim.txt").read_text()) == before


def test_overwrite_replaces_a_marked_run_directory_and_a_marked_older_one(files):
    out = Path(files["tmp"]) / "older"
    assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / ".cfl-run").read_text())["cfl_run_directory"] is True
    (out / ".cfl-run").unlink()  # as a cfl from before the marker left it
    assert main(["run", files["cfg"], "--out", str(out), "--overwrite", "--quiet"]) == 2
    (out / ".cfl-run").touch()  # what the refusal says to do
    assert main(["run", files["cfg"], "--out", str(out), "--overwrite", "--quiet", "--set", "seed=1"]) == 0
    assert json.loads((out / "results.json").read_text())["seed"] == 1


def test_a_lost_lock_stops_before_the_rounds_line_and_keeps_the_checkpoint(files, monkeypatch):
    out = Path(files["tmp"]) / "lost-then-resumed"
    lose_lock_in_round(monkeypatch, "deleted")
    assert main(["run", files["cfg"], "--out", str(out), "--quiet"]) == 3
    rounds = [line for line in (out / "metrics.jsonl").read_text().splitlines() if '"kind": "round"' in line]
    assert len(rounds) == 1 and checkpoint.load(out)["progress"]["global_round"] == 1
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert metrics_values(out / "metrics.jsonl") == metrics_values(Path(files["finished"]) / "metrics.jsonl")


def test_non_utf8_bytes_after_the_last_line_are_cut_on_resume(files):
    import shutil

    out = Path(files["tmp"]) / "binary-tail"
    shutil.copytree(files["finished"], out)
    whole = (out / "metrics.jsonl").read_bytes()
    for tail in (b"\xff\xfe\x00\x80 torn", b'{"kind": "round", "task": \xe9\n'):
        (out / "metrics.jsonl").write_bytes(whole + tail)
        assert main(["run", "--resume", str(out), "--quiet"]) == 0
        assert (out / "metrics.jsonl").read_bytes() == whole


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
    (tmp / "busy" / ".cfl-run").touch()  # a run directory cfl made
    return {"tmp": str(tmp), "cfg": str(tmp / "tiny.yaml"), "file": str(tmp / "afile"),
            "readonly": str(tmp / "readonly"), "finished": str(tmp / "finished"), "busy": str(tmp / "busy"),
            **make_fs_files(tmp)}


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
        monkeypatch.setattr(cfl.app.single_run, "load_stream", load_stream)
    elif fault == "lock":
        stack.enter_context(locked(Path(files["busy"])))
    elif fault == "readonly":
        os.chmod(files["readonly"], 0o555)
        stack.callback(os.chmod, files["readonly"], 0o755)
        real_access = os.access  # root may write anywhere: let the check see the mode bits (r-x)
        monkeypatch.setattr(rundir.os, "access", lambda p, m: not (Path(p) == Path(files["readonly"]) and m & os.W_OK)
                            and real_access(p, m))
    elif fault in ("disk", "disk0"):
        fail_writes_after_round(monkeypatch, 2 if fault == "disk" else 0)
    elif fault in FS_FAULTS:
        apply_fs_fault(fault, files, monkeypatch, stack)


def snapshot(run_dir: str) -> dict:
    """Every output file and its (mtime, size); the lock file records each later holder and is left out."""
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in Path(run_dir).iterdir() if p.name != ".cfl.lock"}


def test_the_table_covers_every_fault():
    assert {c[2] for c in CASES} == {"", "data", "lock", "readonly", "disk", "disk0"} | FS_FAULTS
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
    assert metrics_values(out / "metrics.jsonl") == metrics_values(finished / "metrics.jsonl")


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
    from tests.engine.test_resume import SLOW_PLUGIN

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
