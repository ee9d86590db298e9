"""benchmarks/bit_for_bit.py compares two runs' results.json to the last digit, less what measures the machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bit_for_bit  # noqa: E402
from bit_for_bit import differing_keys  # noqa: E402


def test_timing_and_provenance_are_dropped_and_a_last_digit_is_not() -> None:
    a = {"acc": 76.859, "wall_seconds": 3.0, "record": {"commit": "a"}, "method_stats": {"x": 1, "fit_seconds": 2}}
    b = {"acc": 76.859, "wall_seconds": 9.0, "record": {"commit": "b"}, "method_stats": {"x": 1, "fit_seconds": 7}}
    assert differing_keys(a, b) == []
    assert differing_keys(a, {**b, "acc": 76.85900000000001}) == ["acc"]
    assert differing_keys(a, {**b, "extra": 1}) == ["extra"]


def test_the_engine_path_taken_is_compared_and_its_reason_text_said_apart() -> None:
    from bit_for_bit import reason_differs

    a = {"acc": 1.0, "engine_path": {"path": "vmap", "reason": "method m overrides extra_loss"}}
    b = {"acc": 1.0, "engine_path": {"path": "vmap", "reason": "method m declares losses 'extra'"}}
    assert differing_keys(a, b) == [] and reason_differs(a, b)
    assert differing_keys(a, {**b, "engine_path": {"path": "stacked", "reason": "x"}}) == ["engine_path"]
    assert not reason_differs(a, a)


def test_an_allowed_key_is_left_out_and_a_timing_key_anywhere_in_a_name_is_dropped() -> None:
    a = {"acc": 1.0, "config": {"schedule": {"name": "s"}}, "method_stats": {"fot": {"client_seconds_mean": 1.0}}}
    b = {"acc": 1.0, "config": {"schedule": {"name": "s", "forgetting": "last_finisher"}},
         "method_stats": {"fot": {"client_seconds_mean": 2.0}}}
    assert differing_keys(a, b) == ["config"]
    assert differing_keys(a, b, ("config.schedule.forgetting",)) == []
    assert differing_keys(a, {**b, "acc": 2.0}, ("config.schedule.forgetting",)) == ["acc"]


def test_two_calls_made_apart_are_compared_alone(tmp_path, capsys) -> None:
    """``--reuse-base --reuse-branch``: the results two ``--only-base`` calls left are compared, nothing is run."""
    for side, acc in (("base", 90.0), ("branch", 90.0)):
        (tmp_path / side / "0" / "run").mkdir(parents=True)
        (tmp_path / side / "0" / "run" / "results.json").write_text(json.dumps({"acc": acc, "wall_seconds": 1}))
    argv = ["--base", "nowhere", "--branch", "nowhere", "--out", str(tmp_path), "--reuse-base", "--reuse-branch",
            "configs/quickstart.yaml"]
    assert bit_for_bit.main(argv) == 0 and "1 of 1 runs bit for bit" in capsys.readouterr().out
    (tmp_path / "branch" / "0" / "run" / "results.json").write_text(json.dumps({"acc": 90.01, "wall_seconds": 2}))
    assert bit_for_bit.main(argv) == 1 and "DIFFERS" in capsys.readouterr().out


def test_a_record_config_keeps_what_its_model_reads_and_adds_what_it_ran_with() -> None:
    saved = {"out": "runs/x", "method": {"name": "lora"},
             "model": {"name": "vit-ti16", "train": "lora", "prompt_length": 5, "prompt_pool": 10, "lora_rank": 4}}
    config = bit_for_bit.record_config(saved)
    assert "out" not in config
    assert config["model"] == {"name": "vit-ti16", "train": "lora", "lora_rank": 4, "weights_trained": False,
                               "lora_targets": "qkv", "lora_layers": 0, "lora_tasks": "shared",
                               "classifier": "linear", "weights_origin": None}
    codap = bit_for_bit.record_config({"method": {"name": "codap"},
                                       "model": {"name": "vit-ti16", "train": "components"}})
    assert codap["model"]["component_layers"] == 0 and codap["method"]["start"] == "at-once"  # its old forms
    scratch = bit_for_bit.record_config({"model": {"name": "mlp", "train": "head", "prompt_length": 5}})
    assert scratch["model"] == {"name": "mlp", "train": "head", "weights_trained": False, "weights_origin": None}


def test_one_record_of_every_committed_table_reads_as_a_config_today() -> None:
    """Older records saved every adapter key at its resolved value; today those are refused where unread, so the
    tool must leave them out for a record to re-run (the first record of each table, in the order listed)."""
    from cfl.validation import from_dict

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    tables = sorted(p for p in results.iterdir() if p.is_dir())
    assert len(tables) >= 5
    for table in tables:
        first = sorted(table.glob("*/results.json"))[0]
        from_dict(bit_for_bit.record_config(json.loads(first.read_text())["config"]), read_weights=False)
