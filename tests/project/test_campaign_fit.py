"""``campaign.py run --fit``: a run whose other seeds' records took longer than the minutes left is passed over
(said, nothing started); one whose records fit starts, as does one with no record to estimate from (said)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "benchmarks" / "campaign.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from campaign_fit import expected_seconds, fit_verdict  # noqa: E402
from campaign_plan import load_tables, planned_runs  # noqa: E402


def _tables(tmp: Path) -> Path:
    tiny = tmp / "tiny.yaml"
    tiny.write_text(f"base: {ROOT / 'configs' / 'quickstart.yaml'}\n"
                    "set: {stream.num_tasks: 2, rounds_per_task: 1, threads: 1, wandb.mode: disabled}\n"
                    "grid:\n  variant:\n    - {label: fedavg, method: {name: fedavg}}\n"
                    "    - {label: ewc, method: {name: ewc}}\n")
    tables = tmp / "tables.yaml"
    tables.write_text(f"tables:\n  tiny:\n    title: Tiny\n    sweeps: [{tiny}]\n    seeds: [0, 1, 2]\n")
    return tables


def _record(tmp: Path, name: str, wall: float) -> None:
    record = tmp / "results" / "tiny" / name
    record.mkdir(parents=True)
    (record / "results.json").write_text(json.dumps({"wall_seconds": wall}))


def _runs(tmp: Path) -> list:
    return planned_runs(load_tables(_tables(tmp)), tmp / "work", tmp / "results", {}, None)


def test_the_estimate_is_the_longest_record_of_the_same_table_and_label(tmp_path: Path) -> None:
    _record(tmp_path, "fedavg__seed=0", 120.0)
    _record(tmp_path, "fedavg__seed=1", 300.0)
    _record(tmp_path, "ewc__seed=0", 9000.0)  # another label: not fedavg's estimate
    runs = _runs(tmp_path)
    fedavg2 = next(r for r in runs if r.name == "fedavg__seed=2")
    ewc1 = next(r for r in runs if r.name == "ewc__seed=1")
    assert expected_seconds(fedavg2, runs) == 300.0 and expected_seconds(ewc1, runs) == 9000.0
    assert fit_verdict(fedavg2, runs, 301.0)[0] and not fit_verdict(fedavg2, runs, 299.0)[0]
    starts, why = fit_verdict(ewc1, runs, 600.0)
    assert not starts and "up to 150 min" in why and "10 min are left" in why
    ewc2 = next(r for r in runs if r.name == "ewc__seed=2")
    _record(tmp_path, "ewc__seed=1", 10.0)  # the longest of ewc's two records stays its estimate
    assert expected_seconds(ewc2, _runs(tmp_path)) == 9000.0


def test_run_fit_passes_over_what_cannot_finish_and_says_so(tmp_path: Path) -> None:
    for seed in (0, 1):
        _record(tmp_path, f"fedavg__seed={seed}", 1.0e6)
        _record(tmp_path, f"ewc__seed={seed}", 1.0e6)
    common = ["--tables-file", str(_tables(tmp_path)), "--work", str(tmp_path / "work"),
              "--results", str(tmp_path / "results")]
    done = subprocess.run([sys.executable, str(CAMPAIGN), "run", "--minutes", "30", "--jobs", "1", "--fit", *common],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tiny/fedavg__seed=2 not started (--fit): its other seeds' records took up to 16667 min" in done.stdout
    assert "tiny/ewc__seed=2 not started (--fit)" in done.stdout
    assert "starting" not in done.stdout and not list((tmp_path / "work" / "tiny").glob("*__seed=*"))
    assert "tiny: 6 runs, 4 recorded, 0 checkpointed, 2 to do" in done.stdout
