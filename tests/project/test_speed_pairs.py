"""benchmarks/speed_pairs.py: base and branch alternated, each side's median and the pairs' ratio read from the
benchmark's last JSON line; a benchmark that reports no per-round key is exit 2 naming the keys."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "speed_pairs.py"


def _checkout(root: Path, name: str, line: dict) -> Path:
    path = root / name / "bench.py"
    path.parent.mkdir(parents=True)
    path.write_text(f"print('warming up')\nprint({json.dumps(json.dumps(line))})\n")
    return path.parent


def test_the_ratio_is_branch_over_base_and_each_side_is_its_own(tmp_path):
    base = _checkout(tmp_path, "base", {"engine_sec_per_round": 2.0})
    branch = _checkout(tmp_path, "branch", {"engine_sec_per_round": 1.5, "cfl_sec_per_round": 9.0})
    out = subprocess.run([sys.executable, str(SCRIPT), "--base", str(base), "--branch", str(branch), "--pairs", "2",
                          "--", "bench.py"], capture_output=True, text=True, check=True).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["base_median_sec_per_round"] == 2.0 and summary["branch_median_sec_per_round"] == 1.5
    assert summary["ratio_median"] == 0.75 and out.count("pair ") == 2


def test_a_benchmark_without_a_per_round_key_is_refused(tmp_path):
    base = _checkout(tmp_path, "base", {"other": 1})
    done = subprocess.run([sys.executable, str(SCRIPT), "--base", str(base), "--branch", str(base), "--", "bench.py"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "engine_sec_per_round" in done.stderr and "cfl_sec_per_round" in done.stderr
