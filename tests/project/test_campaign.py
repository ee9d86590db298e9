"""benchmarks/campaign.py on the CPU with a tiny table: plan, run, a kill between two "sessions" (a Ctrl-C that
cuts the runs off with checkpoints, packed into an archive and unpacked on a fresh work directory), resume, and
records equal to those of an uninterrupted campaign."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "benchmarks" / "campaign.py"


def _tables(tmp: Path) -> Path:
    sweep = tmp / "tiny.yaml"
    sweep.write_text(
        f"base: {ROOT / 'configs' / 'quickstart.yaml'}\n"
        "set: {stream.num_tasks: 2, rounds_per_task: 20, threads: 1, checkpoint_every: 1, eval_every: 0,\n"
        "      wandb.mode: disabled}\n"
        "grid:\n  variant:\n    - {label: fedavg, method: {name: fedavg}}\n  seed: [0]\n")
    tables = tmp / "tables.yaml"
    tables.write_text(f"tables:\n  tiny:\n    title: Tiny\n    sweeps: [{sweep}]\n    seeds: [0, 1]\n")
    return tables


def _campaign(*args: str | Path) -> list[str]:
    return [sys.executable, str(CAMPAIGN), *map(str, args)]


def _acc_matrices(results: Path) -> dict[str, list]:
    return {p.parent.name: json.loads(p.read_text())["acc_matrix"] for p in sorted(results.rglob("results.json"))}


def _processes_naming(path: Path) -> list[int]:
    """The pids of the processes whose command line names ``path`` (a campaign's ``cfl run`` children)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_plan_counts_and_a_zero_minute_run_starts_nothing(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    common = ["--tables-file", tables, "--work", tmp_path / "work", "--results", tmp_path / "results"]
    plan = subprocess.run(_campaign("plan", *common), capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "tiny: 2 runs, 0 recorded, 0 checkpointed, 2 to do" in plan.stdout
    run = subprocess.run(_campaign("run", "--minutes", "0", "--jobs", "1", *common), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "starting" not in run.stdout and not (tmp_path / "results").exists()


def test_bad_arguments_are_refused_with_exit_2(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    for args in (["run", "--jobs", "1"], ["run", "--minutes", "1", "--jobs", "0"], ["plan", "--table", "nope"],
                 ["plan", "--set", "novalue"]):
        proc = subprocess.run(_campaign(*args, "--tables-file", tables, "--work", tmp_path / "w"),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "campaign: error:" in proc.stderr, (args, proc.stderr)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the campaign's runs through /proc (Linux)")
def test_a_campaign_cut_off_packed_and_resumed_elsewhere_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    reference = tmp_path / "reference"
    straight = subprocess.run(_campaign("run", "--minutes", "10", "--jobs", "2", "--tables-file", tables,
                                        "--work", reference / "work", "--results", reference / "results"),
                              capture_output=True, text=True, timeout=600)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    expected = _acc_matrices(reference / "results")
    assert sorted(expected) == ["fedavg__seed=0", "fedavg__seed=1"]

    results, archive = tmp_path / "results", tmp_path / "carry" / "campaign.tar.gz"
    first = subprocess.Popen(_campaign("run", "--minutes", "10", "--jobs", "2", "--tables-file", tables,
                                       "--work", tmp_path / "session1", "--results", results, "--pack", archive),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 300
    while not list((tmp_path / "session1").rglob("checkpoint.pt")) and time.monotonic() < end:
        assert first.poll() is None, first.communicate()[0]
        time.sleep(0.02)
    runs = _processes_naming(tmp_path / "session1")
    for pid in runs:  # frozen mid-run, so that the Ctrl-C below finds them running whatever the machine's load
        os.kill(pid, signal.SIGSTOP)
    os.kill(first.pid, signal.SIGINT)  # the session ends: Ctrl-C, as the deadline does
    time.sleep(1.0)
    for pid in runs:
        os.kill(pid, signal.SIGCONT)
    out = first.communicate(timeout=300)[0]
    assert first.returncode == 0, out
    assert "interrupted" in out and "packed" in out
    assert archive.is_file()

    second = subprocess.run(_campaign("run", "--minutes", "10", "--jobs", "2", "--tables-file", tables,
                                      "--work", tmp_path / "session2", "--results", results, "--unpack", archive),
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    if "cut off" in out:  # a run cut off in the first session resumes from its packed checkpoint in the second
        assert "resuming" in second.stdout, second.stdout
    assert _acc_matrices(results) == expected
    for work in (reference / "work", tmp_path / "session2"):  # every run recorded: no checkpoint left
        assert not list(work.rglob("checkpoint.pt")), sorted(work.rglob("*"))
    run = json.loads((results / "tiny" / "fedavg__seed=0" / "results.json").read_text())
    record = run["record"]
    assert record["table"] == "tiny" and record["machine"]["torch"] and record["commit"]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from campaign_plan import load_tables
    from campaign_tables import render_table

    table = render_table("tiny", load_tables(tables)["tiny"], results)
    assert "2 records" in table and "| 2 |" in table  # one row of two runs (seeds 0 and 1)
    assert "No records yet" not in table
