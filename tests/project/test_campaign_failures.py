"""benchmarks/campaign_failures.py: a campaign run that diverged (exit 3 on non-finite values) gets a failure record
``failed.json`` and is planned as failed, never rerun; a crash, a hook that raised or a lost lock is not recorded;
``record-failed`` turns the logs of runs an older campaign left unrecorded into failure records; the archive
carries them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import campaign  # noqa: E402
from campaign_failures import short_cause  # noqa: E402
from campaign_plan import PlannedRun, config_yaml, load_tables, plan_text, table_runs  # noqa: E402
from campaign_records import pack, unpack  # noqa: E402

#: the stop message of a real run (split-fmnist-class-il-tuning, ewc lam=1000 at lr 0.01), its paths shortened
PENALTY = ("cfl: non-finite loss or update at task 2 (0-based), round 4 of the task, client(s) [11, 20, 95]; lower lr "
           "(now 0.01) or check the method's parameters. Likely cause: method ewc's penalty has weight 2.016e+04 on "
           "parameter head.weight of client 95; a local SGD step (lr 0.01, momentum 0.0) on a quadratic penalty "
           "diverges where lr x weight > 2 (1 + momentum), here 202 > 2: lower the penalty's strength (method ewc's "
           "parameters: lam, mode, gamma, fisher, fisher_samples) so that its weight stays below 200, or lower lr. "
           "Stopped; the last checkpoint (after round 40) is kept in runs/x/checkpoint.pt; resume with: cfl run "
           "--resume runs/x")
HOOK = ("cfl: method 'si' (SI in cfl/methods/si.py), hook carry_step: made non-finite values (NaN or inf) from finite "
        "arguments (the run stopped on them: a hook's division by zero, log of 0 or overflow, not lr, is the cause); "
        "in the result['path']['body.1.weight']; at task 3 (0-based), round 9 of the task. Stopped; the last "
        "checkpoint (after round 60) is kept in runs/x/checkpoint.pt; resume with: cfl run --resume runs/x once the "
        "hook is fixed")
SERVER = ("cfl: non-finite global model after the server step at task 0 (0-based), round 1 of the task (parameter(s) "
          "head.weight; every client update was finite): lower server_lr (now 1e+39), or the aggregator (mean). "
          "Stopped; the last checkpoint (after round 0) is kept in runs/x/checkpoint.pt")
#: exit-3 stops that are no divergence (docs/reliability.md): a hook that raised, the lock file taken away
RAISED = ("cfl: method 'sn' (...), hook step_gradient raised ZeroDivisionError: division by zero; at task 1 "
          "(0-based), round 1 of the task. Stopped; the last checkpoint (after round 3) is kept in runs/x")
LOCK = ("cfl: the run's lock file runs/x/.cfl.lock was deleted or replaced during the run. Stopped; the last "
        "checkpoint is kept")
START = "cfl: client states on disk in runs/x/client_states (estimated 0.64 GB for 125 clients)\nengine: stacked path"


def _runs(tmp: Path) -> tuple[list[PlannedRun], Path, Path]:
    """The two planned runs (seeds 0, 1) of a tiny table; its tables file and results root."""
    sweep = tmp / "tiny.yaml"
    sweep.write_text(f"base: {ROOT / 'configs' / 'quickstart.yaml'}\nset: {{stream.num_tasks: 2, wandb.mode: "
                     "disabled}\ngrid:\n  variant:\n    - {label: ewc, method: {name: ewc, lam: 1000}}\n  seed: [0]\n")
    tables = tmp / "tables.yaml"
    tables.write_text(f"tables:\n  tiny:\n    sweeps: [{sweep}]\n    seeds: [0, 1]\n")
    results = tmp / "results"
    return table_runs("tiny", load_tables(tables)["tiny"], tmp / "work", results), tables, results


def _stopped(run: PlannedRun, log: str, config: str | None = None) -> None:
    """The run directory a stopped ``cfl run`` leaves: its checkpoint, its config, and the campaign's log of it."""
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "checkpoint.pt").write_bytes(b"checkpoint")
    (run.run_dir / "config.yaml").write_text(config or config_yaml(run.config))
    (run.run_dir.parent / f"{run.name}.log").write_text(f"{START}\n{log}\n")


def test_a_run_that_diverged_gets_a_failure_record_and_is_planned_as_failed(tmp_path: Path, capsys) -> None:
    runs, _, _ = _runs(tmp_path)
    run = runs[0]
    _stopped(run, PENALTY)
    assert run.state == "checkpointed"
    recorded: list[PlannedRun] = []
    campaign.finish(run, 3, "cpu", recorded)
    failure = json.loads((run.record_dir / "failed.json").read_text())
    assert failure["failed"] is True and failure["exit_code"] == 3 and failure["stop"] == PENALTY[len("cfl: "):]
    assert failure["config"] == json.loads(json.dumps(run.config.to_dict()))
    assert failure["config"]["method"]["lam"] == 1000
    assert failure["record"]["table"] == "tiny" and failure["record"]["run"] == run.name
    assert failure["record"]["commit"] and failure["record"]["machine"]["torch"]
    assert recorded == [run] and not (run.record_dir / "results.json").exists()
    assert "diverged tiny/ewc__seed=0 (exit 3: ewc's penalty: lr x weight = 202 > 2 at task 2 (0-based), round 4)" \
        in capsys.readouterr().out
    assert run.state == "failed" and run.done and not run.recorded
    assert plan_text(runs).splitlines()[0] == ("tiny: 2 runs, 0 recorded, 0 checkpointed, 1 to do, 1 failed (diverged, "
                                               "not rerun: delete a run's failed.json to retry it)")
    assert "next: tiny/ewc__seed=1 (to do)" in plan_text(runs)
    assert campaign.campaign([run], minutes=1, jobs=1, device="cpu") == []  # nothing left to run: no process started


@pytest.mark.parametrize("code, log", [(1, "Traceback (most recent call last):\n  ...\nRuntimeError: boom"),
                                       (3, RAISED), (3, LOCK), (137, PENALTY), (4, "cfl: disk full ...")])
def test_a_crash_a_hook_that_raised_or_a_kill_is_not_recorded(tmp_path: Path, capsys, code: int, log: str) -> None:
    run = _runs(tmp_path)[0][0]
    _stopped(run, log)
    campaign.finish(run, code, "cpu", [])
    assert not run.record_dir.exists() and run.state == "checkpointed"
    assert f"tiny/ewc__seed=0 FAILED (exit {code}); its log ends:" in capsys.readouterr().out


def test_the_short_cause_names_the_bound_the_hook_or_the_server_step() -> None:
    assert short_cause(PENALTY[5:]) == "ewc's penalty: lr x weight = 202 > 2 at task 2 (0-based), round 4"
    assert short_cause(HOOK[5:]) == "hook carry_step made non-finite values at task 3 (0-based), round 9"
    assert short_cause(SERVER[5:]) == "non-finite global model after the server step at task 0 (0-based), round 1"
    assert short_cause("non-finite loss or update at task 0 (0-based), round 3 of the task, client(s) [2]; lower lr") \
        == "non-finite loss or update at task 0 (0-based), round 3"


def test_record_failed_turns_the_logs_an_older_campaign_left_into_failure_records(tmp_path: Path, capsys) -> None:
    runs, tables, results = _runs(tmp_path)
    diverged, retried = runs
    _stopped(diverged, HOOK)
    _stopped(retried, f"{SERVER}\n{START}")  # a later attempt started after the stop: its end is unknown
    common = ["--tables-file", str(tables), "--work", str(tmp_path / "work"), "--results", str(results)]
    assert campaign.main(["record-failed", *common]) == 0
    out = capsys.readouterr().out
    assert "diverged tiny/ewc__seed=0 (hook carry_step made non-finite values at task 3 (0-based), round 9)" in out
    assert "campaign: 1 failure record(s) written" in out and "1 checkpointed, 0 to do, 1 failed" in out
    assert json.loads((diverged.record_dir / "failed.json").read_text())["exit_code"] == 3
    assert not retried.record_dir.exists()
    assert campaign.main(["record-failed", *common]) == 0  # a second time: nothing new
    assert "campaign: 0 failure record(s) written" in capsys.readouterr().out


def test_record_failed_refuses_a_log_whose_run_directory_is_of_another_config(tmp_path: Path, capsys) -> None:
    runs, tables, results = _runs(tmp_path)
    _stopped(runs[0], PENALTY, config=config_yaml(runs[1].config))  # seed 1's config: the sweep changed since
    common = ["--tables-file", str(tables), "--work", str(tmp_path / "work"), "--results", str(results)]
    assert campaign.main(["record-failed", *common]) == 0
    assert "holds no checkpoint of the planned config (the sweep changed?); not recorded" in capsys.readouterr().out
    assert not results.exists()


def test_a_failure_record_travels_in_the_archive(tmp_path: Path) -> None:
    run = _runs(tmp_path)[0][0]
    _stopped(run, PENALTY)
    campaign.finish(run, 3, "cpu", [])
    archive = tmp_path / "carry.tar.gz"
    pack(archive, [(f"tiny/{run.name}", run.record_dir / "failed.json")], [])
    elsewhere = tmp_path / "elsewhere"
    assert unpack(archive, elsewhere, tmp_path / "work2")["records"] == 1
    assert (elsewhere / "tiny" / run.name / "failed.json").read_bytes() == (run.record_dir / "failed.json").read_bytes()
