"""benchmarks/campaign_stale.py and cfl/records/saved_configs.py: a record whose config its sweep no longer
plans (a default changed since it was made) is named with its differences; one made before a key existed reads as
the value it ran with; adapter keys its model.train does not read are not compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from campaign_stale import stale_records  # noqa: E402

from cfl.engine.stores.checkpoint import config_changes  # noqa: E402
from cfl.records.saved_configs import with_added_keys  # noqa: E402
from tests.conftest import tiny_config  # noqa: E402


def _tables(tmp: Path, method: str) -> dict:
    sweep = tmp / "tiny.yaml"
    sweep.write_text(f"base: {ROOT / 'configs' / 'quickstart.yaml'}\n"
                     "set: {stream.num_tasks: 2, rounds_per_task: 2, threads: 1, wandb.mode: disabled}\n"
                     f"grid:\n  variant:\n    - {{label: m, method: {method}}}\n  seed: [0]\n")
    return {"tiny": {"title": "Tiny", "sweeps": [str(sweep)], "seeds": [0]}}


def _record(results: Path, config: dict) -> Path:
    path = results / "tiny" / "m__seed=0" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": config}))
    return path


def test_a_record_of_another_default_is_named_with_its_differences_and_one_of_the_planned_config_is_not(
        tmp_path: Path) -> None:
    from campaign_plan import planned_runs

    tables = _tables(tmp_path, "{name: fedprox}")
    planned = planned_runs(tables, tmp_path / "work", tmp_path / "results")[0].config.to_dict()
    path = _record(tmp_path / "results", planned)
    assert stale_records(tables, tmp_path / "results") == []
    path.write_text(json.dumps({"config": {**planned, "method": {**planned["method"], "mu": 0.5}}}))
    [line] = stale_records(tables, tmp_path / "results")
    assert str(path) in line and "method.mu: 0.5 in the record, 0.01 now" in line and "delete it" in line


def test_a_config_saved_before_a_key_existed_reads_as_the_value_it_ran_with() -> None:
    codap = with_added_keys({"model": {"name": "vit-ti16"}, "method": {"name": "codap"}})
    assert codap["model"]["component_layers"] == 0 and codap["method"]["start"] == "at-once"
    assert "start" not in with_added_keys({"model": {}, "method": {"name": "fedavg"}})["method"]
    kept = with_added_keys({"model": {"component_layers": 5}, "method": {"name": "codap", "start": "orthogonal"}})
    assert kept["model"]["component_layers"] == 5 and kept["method"]["start"] == "orthogonal"


def test_adapter_keys_no_model_train_reads_are_not_compared_but_a_read_one_is() -> None:
    cfg = tiny_config(method={"name": "fedavg"})  # an MLP: no adapter key is read
    saved = cfg.to_dict()
    old = {**saved, "model": {k: v for k, v in saved["model"].items() if k not in ("component_layers",
                                                                                   "g_prompt_length")}}
    old["model"]["prompt_length"] = 5  # the default of the cfl that wrote it
    assert config_changes(old, cfg) == ""
    assert "model.name" in config_changes({**old, "model": {**old["model"], "name": "mlp-400"}}, cfg)


def test_a_report_row_holds_runs_made_before_and_after_a_key_was_added(tmp_path: Path) -> None:
    from cfl.report.groups import Run, compared_keys

    new = tiny_config(method={"name": "fedavg"}).to_dict()
    old = {**new, "model": {k: v for k, v in new["model"].items() if k not in ("weights_trained",
                                                                               "component_layers")}}
    runs = [Run(tmp_path / f"{i}" / "results.json", {"method": "fedavg"}, c) for i, c in enumerate((new, old))]
    assert compared_keys(runs[0]) == compared_keys(runs[1])
    codap = {**old, "model": {**old["model"], "train": "components"}, "method": {"name": "codap"}}
    # a codap run from before the key: prompt tuning, not today's prefixes
    assert compared_keys(Run(tmp_path / "c" / "results.json", {}, codap))["model.component_layers"] == 0
