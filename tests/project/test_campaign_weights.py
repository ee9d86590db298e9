"""A table whose sweep names a ``model.weights`` file that is not there (a clean clone: weights are not
committed): plan and tables --check go on without opening it; ``run --table`` refuses it before any run starts;
``run`` over every table leaves that table out and says so; ``cfl run`` of such a config still refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cfl.app.sweep import load_sweep
from cfl.config.schema import ConfigError
from cfl.validation import from_dict

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "benchmarks" / "campaign.py"
MISSING = "weights/no-such-backbone-file.safetensors"


def _pretrained(tmp: Path) -> dict:
    return {"stream": {"name": "split-digits", "num_tasks": 2, "scenario": "class"},
            "model": {"name": "vit-ti16", "weights": str(tmp / MISSING), "image_size": 32, "train": "head"},
            "method": {"name": "fedavg"}, "num_clients": 2, "clients_per_round": 2, "rounds_per_task": 1}


def _tables(tmp: Path) -> Path:
    tiny = tmp / "tiny.yaml"
    tiny.write_text(f"base: {ROOT / 'configs' / 'quickstart.yaml'}\n"
                    "set: {stream.num_tasks: 2, rounds_per_task: 1, threads: 1, wandb.mode: disabled}\n"
                    "grid:\n  variant:\n    - {label: fedavg, method: {name: fedavg}}\n")
    backbone = tmp / "backbone.yaml"
    cfg = _pretrained(tmp)
    backbone.write_text(f"base: {cfg!r}\nset: {{threads: 1, wandb.mode: disabled}}\n"
                        "grid:\n  variant:\n    - {label: probe, model.train: head}\n")
    tables = tmp / "tables.yaml"
    tables.write_text(f"tables:\n  tiny:\n    title: Tiny\n    sweeps: [{tiny}]\n    seeds: [0]\n"
                      f"  backbone:\n    title: Backbone\n    sweeps: [{backbone}]\n    seeds: [0]\n")
    return tables


def _campaign(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    common = ["--tables-file", str(_tables(tmp)), "--work", str(tmp / "work"), "--results", str(tmp / "results")]
    return subprocess.run([sys.executable, str(CAMPAIGN), *args, *common], capture_output=True, text=True,
                          timeout=300)


def test_a_config_is_checked_without_its_weights_file_only_when_asked(tmp_path: Path) -> None:
    cfg = from_dict(_pretrained(tmp_path), read_weights=False)
    assert cfg.model.weights.endswith(MISSING)
    with pytest.raises(ConfigError, match="does not exist"):
        from_dict(_pretrained(tmp_path))
    bad = {**_pretrained(tmp_path), "lr": -1.0}  # every other key is still checked
    with pytest.raises(ConfigError, match="lr"):
        from_dict(bad, read_weights=False)


def test_a_sweep_reads_without_its_weights_file_only_when_asked(tmp_path: Path) -> None:
    _tables(tmp_path)
    runs = load_sweep(tmp_path / "backbone.yaml", out=tmp_path / "runs", read_weights=False)
    assert [r.config.label for r in runs] == ["probe"]
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep(tmp_path / "backbone.yaml", out=tmp_path / "runs")


def test_plan_goes_on_and_run_refuses_the_named_table_before_any_run(tmp_path: Path) -> None:
    plan = _campaign(tmp_path, "plan")
    assert plan.returncode == 0, plan.stderr
    assert "backbone: 1 runs, 0 recorded, 0 checkpointed, 1 to do" in plan.stdout
    run = _campaign(tmp_path, "run", "--minutes", "5", "--jobs", "1", "--table", "backbone")
    assert run.returncode == 2 and "table 'backbone'" in run.stderr and MISSING in run.stderr, run.stderr
    assert "starting" not in run.stdout and not (tmp_path / "work" / "backbone" / "probe__seed=0").exists()


def test_run_over_every_table_leaves_the_table_out_and_says_so(tmp_path: Path) -> None:
    run = _campaign(tmp_path, "run", "--minutes", "0", "--jobs", "1")
    assert run.returncode == 0, run.stderr
    assert "campaign: table 'backbone' left out" in run.stdout and MISSING in run.stdout
    assert "tiny: 1 runs" in run.stdout and not any(line.startswith("backbone:") for line in run.stdout.splitlines())
