"""Permission faults checked by the kernel, not simulated: ``cfl`` runs in a process without the permission.

Root passes every permission check, so under root the commands run without ``CAP_DAC_OVERRIDE`` and
``CAP_DAC_READ_SEARCH`` (``capsh --drop``): the kernel then applies the mode bits to root as to any user.
The same cases run in process, with ``os.access`` simulated, in the table of tests/app/test_refusals_run.py.
"""

import os
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from cfl.app.cli import main
from tests.app.test_refusals_run import DISK_TINY


def without_permission_override(argv: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "cfl", *argv]
    if os.geteuid() != 0:
        return cmd
    if shutil.which("capsh") is None:
        pytest.skip("running as root without capsh: root's permission override cannot be dropped, so a mode bit "
                    "would not stop it (tests/app/test_refusals_run.py simulates these cases)")
    return ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", shlex.join(cmd)]


def test_unsearchable_paths_and_a_read_only_store_are_refused_before_any_work(tmp_path):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(DISK_TINY))
    run = tmp_path / "run"
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(run), "--quiet"]) == 0
    closed = tmp_path / "closed"
    closed.mkdir()
    (closed / "run").mkdir()
    os.chmod(closed, 0o600)  # readable, not searchable
    os.chmod(run / "client_states", 0o555)
    cfg = str(tmp_path / "cfg.yaml")
    cases = [
        (["run", cfg, "--out", f"{closed}/run"], f"--out {closed}/run: cannot look inside {closed}"),
        (["run", "--resume", f"{closed}/run"], f"--resume {closed}/run: cannot look inside {closed}"),
        (["report", str(run), "--plots", f"{closed}/figs"], f"--plots {closed}/figs: cannot look inside {closed}"),
        (["run", "--resume", str(run)], f"{run}/client_states is not writable"),
    ]
    before = sorted(p.name for p in run.iterdir()), (run / "checkpoint.pt").stat().st_mtime_ns
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        for argv, words in cases:
            proc = subprocess.run(without_permission_override([*argv, "--quiet"] if argv[0] == "run" else argv),
                                  capture_output=True, text=True, timeout=120, env=env)
            assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)
    finally:
        os.chmod(closed, 0o755)
        os.chmod(run / "client_states", 0o755)
    assert (sorted(p.name for p in run.iterdir()), (run / "checkpoint.pt").stat().st_mtime_ns) == before
