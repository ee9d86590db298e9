"""benchmarks/device_check.sh in its dry mode (the CPU, tiny): every step runs and leaves its file, as the GPU
machine's run will, so a lent session's minutes are never spent on a broken script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_device_check_runs_every_step_and_leaves_its_files(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh"), "--dry"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "done: parity exit 0, campaign exit 0" in proc.stdout
    assert json.loads((tmp_path / "device.json").read_text())["device"] == "cpu"
    perf = [json.loads(line) for line in (tmp_path / "perf.jsonl").read_text().splitlines()]
    assert [p["setup"] for p in perf] == ["pmnist"] and perf[0]["kernels_per_step"] > 0
    assert "passed" in (tmp_path / "parity.log").read_text()
    assert (tmp_path / "campaign.tar.gz").is_file() and not (tmp_path / "records").exists()
