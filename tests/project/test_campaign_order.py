"""benchmarks/campaign_plan.py: a table's ``last`` labels wait until every other run of the chosen tables is taken
(the FOT tables' GLFC rows after the six cheaper rows of both tables); a ``last`` label no variant has is
refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from campaign_plan import load_tables, planned_runs  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402

FOT = ["fot-table-pfmnist-iid", "fot-table-pfmnist-noniid"]


def test_the_fot_tables_run_glfc_after_every_other_row_of_both_tables(tmp_path: Path) -> None:
    tables = load_tables()
    runs = planned_runs(tables, tmp_path, tmp_path / "results", chosen=FOT)
    order = [(r.table, r.config.label, r.config.seed) for r in runs]
    six = ["fedavg", "ewc", "er", "gpm", "rgo", "fot"]
    expected = [(t, label, seed) for t in FOT for seed in (0, 1, 2) for label in six]
    expected += [(t, "glfc", seed) for t in FOT for seed in (0, 1, 2)]
    assert order == expected


def test_a_last_label_no_variant_has_is_refused(tmp_path: Path) -> None:
    tables = load_tables()
    table = dict(tables["fot-table-pfmnist-iid"], last=["glfcc"])
    with pytest.raises(ConfigError, match=r"'last' names \['glfcc'\]"):
        planned_runs({"t": table}, tmp_path, tmp_path / "results")
