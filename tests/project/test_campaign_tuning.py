"""benchmarks/campaign_tuning.py: a tuning table's selection (highest final ACC, ties to the first grid point in the
sweep's order), its note, and the refusal of a tuned sweep whose values differ from what the records select (by
``campaign.py tables --check``, ``tables --write`` and ``run``)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import campaign  # noqa: E402
from campaign_plan import RESULTS_ROOT, load_tables  # noqa: E402
from campaign_record_checks import FROM_MATRIX  # noqa: E402
from campaign_tuning import main as tuning_main  # noqa: E402
from campaign_tuning import method_grids, paste_lines, selection_note, tuned_sweep_problems  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402

SETTING = ("set: {stream.scenario: class, stream.num_tasks: 2, rounds_per_task: 1, threads: 1, eval_every: 0,\n"
           "      wandb.mode: disabled}\n")
GRID = """    - {label: ewc lam=10, method: {name: ewc, lam: 10}}
    - {label: ewc lam=100, method: {name: ewc, lam: 100}}
    - {label: ewc lam=1000, method: {name: ewc, lam: 1000}}
    - {label: mas lam=1, method: {name: mas, lam: 1.0}}
    - {label: mas lam=10, method: {name: mas, lam: 10.0}}
"""
#: hand-made final ACC / FGT of each grid point on the tuning seed: EWC's best is lam=100, MAS's two tie
RESULTS = {"ewc lam=10": (18.0, 90.0), "ewc lam=100": (25.5, 70.25), "ewc lam=1000": (21.0, 50.0),
           "mas lam=1": (19.0, 91.0), "mas lam=10": (19.0, 80.0)}
PARAMS = {"ewc lam=10": 10.0, "ewc lam=100": 100.0, "ewc lam=1000": 1000.0, "mas lam=1": 1.0, "mas lam=10": 10.0}


def _sweep(path: Path, variants: str, seeds: str = "[10]") -> Path:
    path.write_text(f"base: {ROOT / 'configs' / 'split-fmnist.yaml'}\n{SETTING}grid:\n  variant:\n{variants}"
                    f"  seed: {seeds}\n")
    return path


def _record(label: str, seed: int = 10, acc: float | None = None) -> dict[str, Any]:
    """A record as the tuning table's run of ``label`` writes it, from a committed record of the defaults table."""
    record = copy.deepcopy(_TEMPLATE)
    method = label.split()[0]
    record["config"].update(label=label, seed=seed, method={**_DEFAULTS[method], "lam": PARAMS[label]})
    final, forgetting = RESULTS[label]
    _set_matrix(record, final if acc is None else acc, forgetting)
    record["record"]["run"] = f"{label}__seed={seed}"
    return record


def _set_matrix(record: dict[str, Any], acc: float, fgt: float) -> None:
    """An accuracy matrix whose final ACC and FGT are ``acc`` and ``fgt`` (each old task peaks at ``q + fgt`` when
    learned and reads ``q`` after; the last task reads ``r``), and every figure the record derives from it."""
    tasks = record["num_tasks"]
    q = min(acc, 100.0 - fgt)
    r = tasks * acc - (tasks - 1) * q
    matrix = [[(q + fgt if j == i else q) if j <= i else 0.0 for j in range(tasks)] for i in range(tasks)]
    matrix[-1] = [q] * (tasks - 1) + [r]
    record["acc_matrix"], record["tasks_completed"] = matrix, tasks
    for key, formula in FROM_MATRIX.items():
        record[key] = formula(matrix, tasks - 1)


_TEMPLATE = json.loads((RESULTS_ROOT / "split-fmnist-class-il" / "ewc__seed=0" / "results.json").read_text())
_DEFAULTS = {m: json.loads((RESULTS_ROOT / "split-fmnist-class-il" / f"{m}__seed=0" / "results.json").read_text())
             ["config"]["method"] for m in ("ewc", "mas")}


def _tuning_table(tmp: Path) -> dict[str, Any]:
    return {"sweeps": [str(_sweep(tmp / "tuning.yaml", GRID))], "seeds": [10], "tuning": True}


def test_the_highest_final_acc_is_chosen_and_a_tie_goes_to_the_first_in_sweep_order(tmp_path: Path) -> None:
    grids = method_grids("t", _tuning_table(tmp_path), [_record(label) for label in reversed(RESULTS)])
    by_method = {g.method: g for g in grids}
    assert [g.method for g in grids] == ["ewc", "mas"]  # the sweep's order, not the records'
    assert by_method["ewc"].varied == ["lam"]
    assert by_method["ewc"].chosen.label == "ewc lam=100" and not by_method["ewc"].all_tie
    assert by_method["mas"].chosen.label == "mas lam=1" and by_method["mas"].all_tie  # 19.0 both: the first


def test_the_mean_over_the_tuning_seeds_decides(tmp_path: Path) -> None:
    table = {**_tuning_table(tmp_path), "seeds": [10, 11]}
    # seed 10 alone picks lam=100 (25.5); seed 11 makes lam=1000's mean the highest
    records = [_record(label) for label in RESULTS]
    records += [_record("ewc lam=10", 11, 10.0), _record("ewc lam=100", 11, 20.0), _record("ewc lam=1000", 11, 40.0),
                _record("mas lam=1", 11), _record("mas lam=10", 11, 20.0)]
    grids = {g.method: g for g in method_grids("t", table, records)}
    assert grids["ewc"].chosen.label == "ewc lam=1000"  # means 14.0, 22.75, 30.5
    assert grids["mas"].chosen.label == "mas lam=10"  # means 19.0 and 19.5


def test_a_method_with_a_missing_grid_point_has_no_chosen_value(tmp_path: Path) -> None:
    grids = {g.method: g for g in method_grids("t", _tuning_table(tmp_path),
                                               [_record(label) for label in RESULTS if label != "ewc lam=1000"])}
    assert grids["ewc"].chosen is None and grids["mas"].chosen is not None
    assert "| ewc | lam=10: 18.00 / 90.00; lam=100: 25.50 / 70.25; lam=1000: not recorded | none yet (2 of 3 " \
           "recorded) |" in selection_note(list(grids.values()))


def test_the_note_shows_every_grid_value_and_the_chosen_one_in_bold(tmp_path: Path) -> None:
    grids = method_grids("t", _tuning_table(tmp_path), [_record(label) for label in RESULTS])
    assert selection_note(grids) == (
        "Grid and chosen value (highest final ACC, the mean over the tuning seeds; a tie goes to the first value in "
        "the sweep's order):\n\n"
        "| method | grid: value ACC / FGT | chosen |\n|---|---|---|\n"
        "| ewc | lam=10: 18.00 / 90.00; **lam=100: 25.50 / 70.25**; lam=1000: 21.00 / 50.00 | lam=100 |\n"
        "| mas | **lam=1: 19.00 / 91.00**; lam=10: 19.00 / 80.00 | lam=1 (every value ties on ACC: the first) |")
    assert paste_lines(grids) == ("    - {label: ewc, method: {name: ewc, lam: 100}}\n"
                                  "    - {label: mas, method: {name: mas, lam: 1.0}}")


def test_a_choice_at_the_grids_lowest_or_highest_value_is_marked_as_at_its_edge(tmp_path: Path) -> None:
    """lam=1000 (the highest) and lam=10 (the lowest) are edges: a better value may lie beyond; lam=100 is not."""
    for best, edge in (("ewc lam=1000", True), ("ewc lam=10", True), ("ewc lam=100", False)):
        records = [_record(label, acc=99.0 if label == best else None) for label in RESULTS]
        ewc = {g.method: g for g in method_grids("t", _tuning_table(tmp_path), records)}["ewc"]
        assert ewc.chosen.label == best and ewc.edge == (["lam"] if edge else [])
        row = next(line for line in selection_note([ewc]).splitlines() if line.startswith("| ewc"))
        assert row.endswith("(at the grid's edge in lam: a value beyond it was not tried) |") is edge
    mas = {g.method: g for g in method_grids("t", _tuning_table(tmp_path), [_record(x) for x in RESULTS])}["mas"]
    assert mas.all_tie and mas.edge == []  # a tie of every value is no edge


def test_a_record_of_no_grid_point_or_other_parameters_is_refused(tmp_path: Path) -> None:
    table = _tuning_table(tmp_path)
    stray = _record("ewc lam=10")
    stray["config"]["label"] = "ewc lam=5"
    with pytest.raises(ConfigError, match="no grid point"):
        method_grids("t", table, [stray])
    changed = _record("ewc lam=10")
    changed["config"]["method"]["lam"] = 5.0
    with pytest.raises(ConfigError, match="not its grid point's"):
        method_grids("t", table, [changed])


def _campaign_files(tmp: Path, ewc_lam: str) -> tuple[Path, Path]:
    """A tables file with a tuning table (records: EWC lam=100, MAS lam=1 chosen) and a tuned table whose sweep
    runs EWC at ``ewc_lam``; the results root."""
    tuning = _sweep(tmp / "tuning.yaml", GRID)
    tuned = _sweep(tmp / "tuned.yaml", f"    - {{label: fedavg, method: {{name: fedavg}}}}\n"
                                       f"    - {{label: ewc, method: {{name: ewc, lam: {ewc_lam}}}}}\n"
                                       f"    - {{label: mas, method: {{name: mas}}}}\n", "[0]")
    tables = tmp / "tables.yaml"
    tables.write_text(f"tables:\n  tuning:\n    sweeps: [{tuning}]\n    seeds: [10]\n    tuning: true\n"
                      f"  tuned:\n    sweeps: [{tuned}]\n    seeds: [0]\n    tuned_by: tuning\n")
    results = tmp / "results"
    for label in RESULTS:
        path = results / "tuning" / f"{label.replace(' ', '_')}__seed=10" / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_record(label)))
    return tables, results


def test_a_tuned_sweep_with_another_value_than_the_records_select_is_refused(tmp_path: Path, capsys) -> None:
    tables, results = _campaign_files(tmp_path, "10")
    problems = tuned_sweep_problems(load_tables(tables), results)
    assert len(problems) == 1  # MAS's default lam (1.0) is its chosen value
    assert "ewc" in problems[0] and str(tmp_path / "tuned.yaml") in problems[0]
    assert "sets lam: 10;" in problems[0] and "select lam: 100: write lam: 100 in it" in problems[0]
    doc = tmp_path / "results.md"
    doc.write_text("<!-- campaign:tuning -->\n<!-- /campaign:tuning -->\n<!-- campaign:tuned -->\n"
                   "<!-- /campaign:tuned -->\n")
    before = doc.read_text()
    common = ["--tables-file", str(tables), "--results", str(results), "--work", str(tmp_path / "work")]
    assert campaign.main(["tables", "--write", str(doc), *common]) == 2 and doc.read_text() == before
    assert campaign.main(["tables", "--check", str(doc), *common]) == 1
    assert campaign.main(["run", "--minutes", "0", "--table", "tuned", *common]) == 2
    assert "write lam: 100 in it" in capsys.readouterr().err
    assert tuning_main(["--table", "tuning", "--tables-file", str(tables), "--results", str(results)]) == 0
    out = capsys.readouterr()
    assert "    - {label: ewc, method: {name: ewc, lam: 100}}" in out.out and "write lam: 100" in out.err


def test_a_tuned_sweep_with_the_selected_values_passes_and_its_tuning_note_is_written(tmp_path: Path) -> None:
    tables, results = _campaign_files(tmp_path, "100.0")
    assert tuned_sweep_problems(load_tables(tables), results) == []
    doc = tmp_path / "results.md"
    doc.write_text("<!-- campaign:tuning -->\n<!-- /campaign:tuning -->\n<!-- campaign:tuned -->\n"
                   "<!-- /campaign:tuned -->\n")
    common = ["--tables-file", str(tables), "--results", str(results)]
    assert campaign.main(["tables", "--write", str(doc), *common]) == 0
    assert "**lam=100: 25.50 / 70.25**" in doc.read_text()
    assert campaign.main(["tables", "--check", str(doc), *common]) == 0


def test_a_run_of_a_tuned_table_waits_for_its_tuning_records(tmp_path: Path) -> None:
    tables, results = _campaign_files(tmp_path, "100")
    (results / "tuning" / "mas_lam=10__seed=10" / "results.json").unlink()
    common = ["--tables-file", str(tables), "--results", str(results), "--work", str(tmp_path / "work")]
    assert tuned_sweep_problems(load_tables(tables), results) == []  # the docs may show a grid half done
    assert campaign.main(["run", "--minutes", "0", "--table", "tuned", *common]) == 2


def test_tuned_by_must_name_a_tuning_table(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "s.yaml", GRID)
    tables = tmp_path / "tables.yaml"
    tables.write_text(f"tables:\n  a:\n    sweeps: [{sweep}]\n  b:\n    sweeps: [{sweep}]\n    tuned_by: a\n")
    with pytest.raises(ConfigError, match="'tuned_by' must name a table of the file with 'tuning: true'"):
        load_tables(tables)
    tables.write_text(f"tables:\n  a:\n    sweeps: [{sweep}]\n    tuning: yes please\n")
    with pytest.raises(ConfigError, match="'tuning' must be true or false"):
        load_tables(tables)


def test_the_committed_tuned_sweep_runs_what_the_committed_tuning_records_select() -> None:
    assert tuned_sweep_problems(load_tables(), RESULTS_ROOT) == []


def test_a_campaign_writing_its_records_elsewhere_takes_the_committed_tuning_records(tmp_path: Path) -> None:
    """The device check runs the campaign with ``--results $OUT/records`` (empty): the tuned table still runs."""
    assert tuned_sweep_problems(load_tables(), tmp_path / "records", require_chosen=True) == []


def _failure(label: str, cause: str = "here 202 > 2:") -> dict[str, Any]:
    """The failure record (failed.json) of grid point ``label`` that diverged on the tuning seed."""
    record = _record(label)
    stop = (f"non-finite loss or update at task 2 (0-based), round 4 of the task, client(s) [3]; lower lr (now 0.01). "
            f"Likely cause: method {record['config']['method']['name']}'s penalty has weight 2e+04 on parameter "
            f"head.weight of client 3; a local SGD step ... diverges where lr x weight > 2 (1 + momentum), {cause} "
            "lower the penalty's strength. Stopped; the last checkpoint (after round 40) is kept")
    return {"failed": True, "exit_code": 3, "stop": stop, "cause": "-", "config": record["config"],
            "record": record["record"]}


def test_a_point_that_diverged_counts_as_measured_and_is_never_chosen(tmp_path: Path) -> None:
    records = [_record(label) for label in RESULTS if label != "ewc lam=100"]
    grids = {g.method: g for g in method_grids("t", _tuning_table(tmp_path), records, [_failure("ewc lam=100")])}
    ewc = grids["ewc"]
    assert ewc.complete and ewc.recorded == 3 and ewc.chosen.label == "ewc lam=1000"  # 21.0 over 18.0; lam=100 diverged
    assert ("| ewc | lam=10: 18.00 / 90.00; lam=100: diverged (exit 3): ewc's penalty: lr x weight = 202 > 2 at task "
            "2 (0-based), round 4; **lam=1000: 21.00 / 50.00** | lam=1000 (at the grid's edge in lam: a value "
            "beyond it was not tried) |") in selection_note(list(grids.values()))


def test_a_method_whose_every_point_diverged_gets_no_choice_and_says_so(tmp_path: Path) -> None:
    records = [_record(label) for label in RESULTS if not label.startswith("mas")]
    failures = [_failure("mas lam=1", "here 3.1 > 2:"), _failure("mas lam=10", "here 31 > 2:")]
    grids = {g.method: g for g in method_grids("t", _tuning_table(tmp_path), records, failures)}
    mas = grids["mas"]
    assert mas.complete and mas.all_diverged and mas.chosen is None and not mas.all_tie
    assert ("| mas | lam=1: diverged (exit 3): mas's penalty: lr x weight = 3.1 > 2 at task 2 (0-based), round 4; "
            "lam=10: diverged (exit 3): mas's penalty: lr x weight = 31 > 2 at task 2 (0-based), round 4 | none: every "
            "value diverged |") in selection_note(list(grids.values()))
    assert ("    # mas: no value chosen: every one of its 2 grid points diverged (exit 3); add values the method "
            "trains at") in paste_lines(list(grids.values()))


def test_a_tuned_table_refuses_to_run_a_method_whose_every_point_diverged(tmp_path: Path) -> None:
    tables, results = _campaign_files(tmp_path, "100")
    for label in ("mas lam=1", "mas lam=10"):
        run = results / "tuning" / f"{label.replace(' ', '_')}__seed=10"
        (run / "results.json").unlink()
        (run / "failed.json").write_text(json.dumps(_failure(label)))
    problems = tuned_sweep_problems(load_tables(tables), results, require_chosen=True)
    assert problems == [f"table tuned: mas has no chosen value: every one of its 2 grid points of table tuning "
                        f"diverged (exit 3); add values it trains at to that table's sweep and run it, or drop mas "
                        f"from {tmp_path / 'tuned.yaml'}"]


def test_a_result_and_a_failure_of_one_point_and_seed_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has a result and a failure record"):
        method_grids("t", _tuning_table(tmp_path), [_record("ewc lam=10")], [_failure("ewc lam=10")])
