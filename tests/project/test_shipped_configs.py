"""Every config and sweep file shipped under configs/ and benchmarks/ passes validation (the keys, the values, the
checks between them), so that none fails for a user at its first run. Generated from the files."""

from pathlib import Path

import pytest

from cfl.app.sweep import load_sweep
from cfl.config.yaml_files import read_yaml
from cfl.validation import load_config

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(p for d in ("configs", "benchmarks") for p in (ROOT / d).rglob("*.yaml"))


def _kind(path: Path) -> str:
    spec = read_yaml(path)
    if "tables" in spec:
        return "tables"
    if "grid" in spec:
        return "sweep"
    return "wandb" if "parameters" in spec else "config"


def test_the_files_are_found():
    kinds = [_kind(p) for p in FILES]
    assert kinds.count("sweep") >= 5 and kinds.count("config") >= 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_file_is_valid(path, tmp_path):
    kind = _kind(path)
    if kind == "sweep":  # a weights file is not committed: every key but the file's presence is checked
        runs = load_sweep(path, out=tmp_path / "runs", read_weights=False)
        assert runs and all(r.config.method for r in runs)
    elif kind == "config":
        assert load_config(path, []).seed is not None
    elif kind == "tables":  # the campaign's tables: every table's runs plan (their sweeps validated above)
        import sys

        sys.path.insert(0, str(ROOT / "benchmarks"))
        from campaign_plan import load_tables, planned_runs

        assert planned_runs(load_tables(path), tmp_path / "work")
    # W&B sweep files: tests/report/test_wandb_sweep.py
