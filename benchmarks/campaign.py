"""A run campaign that uses whatever minutes a machine is held for: the evidence tables' runs, taken in order, run as
many at once as the machine holds for at most a given time, cut off with a checkpoint, and carried to the next
campaign in one archive.

    python benchmarks/campaign.py plan  [--table NAME]... [--work DIR]
    python benchmarks/campaign.py run   --minutes M [--jobs N] [--fit] [--set KEY=VALUE]... [--table NAME]...
                                        [--work DIR] [--unpack ARCHIVE] [--pack ARCHIVE]
    python benchmarks/campaign.py tables [--write docs/results.md | --check docs/results.md]
    python benchmarks/campaign.py record-failed [--table NAME]... [--work DIR]

A table with ``tuned_by: TUNING`` runs the values that the tuning table's records choose
(benchmarks/campaign_tuning.py): ``run`` refuses it until every tuned method has a chosen value written in its sweep,
``tables --check`` fails and ``tables --write`` refuses (exit 2, nothing written) while its sweep differs from them.

``run`` first unpacks an archive an earlier campaign packed (its records into ``benchmarks/results/``, its
checkpoints into the work directory), then starts the next runs that have no record (``cfl run`` processes,
``--resume`` where a checkpoint of the same config is there), ``--jobs`` at a time, and starts none after the
deadline. At the deadline each running run gets ``SIGINT``: it stops after its round with a checkpoint (exit 130,
docs/reliability.md). Every run that finished becomes a record; ``--pack`` writes the new records and every
unfinished run's checkpoint into one archive (a few files, the size printed) for the next campaign. Ctrl-C does
the same as the deadline, at once. ``--set device=cuda`` on a GPU machine (the key is resume-safe). ``--fit``
passes over a run whose other seeds' records took longer than the minutes left (each verdict on stdout), so a
session whose machine will not keep the pack spends its minutes on runs it can finish.

A run that diverged (exit 3 with a stop message naming non-finite values, docs/reliability.md) is a result of its
table: it gets a failure record ``failed.json`` beside where its record would be (benchmarks/campaign_failures.py),
``plan`` counts it as failed and no campaign runs it again (delete the file to retry it). Any other failure (exit
other than 0, 3 on divergence or 130) is reported with its log's last lines and left unrecorded, to be run again.
``record-failed`` writes the failure records of runs that diverged under an older campaign, which left them
unrecorded: each planned run, not done, whose log (``<work>/<table>/<run name>.log``) ends with a divergence's stop
message and whose run directory holds a checkpoint of its config.

Weights files (``model.weights``) are not committed: ``plan`` and ``tables`` read the sweeps without them (a clean
clone checks its records); ``run --table NAME`` refuses a table whose runs to do name a file that is not there
(before any run starts), and ``run`` over every table leaves such a table out, one line on stdout saying so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the campaign's sibling modules

from campaign_failures import FAILED, diverged, short_cause, write_failure  # noqa: E402
from campaign_fit import fit_verdict  # noqa: E402
from campaign_plan import (  # noqa: E402
    RESULTS_ROOT,
    ROOT,
    TABLES_FILE,
    PlannedRun,
    config_yaml,
    load_tables,
    parse_sets,
    plan_text,
    planned_runs,
    without_weights,
)
from campaign_records import pack, unpack, write_record  # noqa: E402
from campaign_tables import check_tables, write_tables  # noqa: E402
from campaign_tuning import tuned_sweep_problems  # noqa: E402

from cfl.config.keys import ConfigError  # noqa: E402

#: seconds a cut-off run gets to finish its round and write its checkpoint before it is terminated
GRACE_SECONDS = 300


def start(run: PlannedRun) -> subprocess.Popen:
    """``cfl run`` for ``run`` in a process of its own (its log beside its run directory): resumed where its
    checkpoint is of the same config, else started anew."""
    run.run_dir.parent.mkdir(parents=True, exist_ok=True)
    if run.checkpointed:
        args = ["run", "--resume", str(run.run_dir), "--quiet"]
        how = "resuming"
    else:
        config = run.run_dir.parent / f"{run.name}.yaml"
        config.write_text(config_yaml(run.config))
        args = ["run", str(config), "--out", str(run.run_dir), "--quiet", "--overwrite"]
        how = "starting"
    print(f"campaign: {how} {run.table}/{run.name}", flush=True)
    log = open(run.run_dir.parent / f"{run.name}.log", "a")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "cfl", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def log_tail(run: PlannedRun, lines: int = 8) -> str:
    path = run.run_dir.parent / f"{run.name}.log"
    text = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return "\n".join("    " + line for line in text[-lines:])


def stop_all(running: dict[PlannedRun, subprocess.Popen], grace: float) -> None:
    """SIGINT to every running run (each checkpoints after its round), then SIGTERM and SIGKILL past ``grace``."""
    for proc in running.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
    end = time.monotonic() + grace
    while any(p.poll() is None for p in running.values()) and time.monotonic() < end:
        time.sleep(0.2)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
        time.sleep(2)


#: what a run directory holds only to resume it: removed once the run has its record (a campaign of many runs of
#: many clients otherwise fills the disk: 59 class-incremental runs of 125 clients left 23 GB of client states)
RESUME_ONLY = ("checkpoint.pt", "client_states")


def free_run_dir(run_dir: Path) -> int:
    """Remove what ``run_dir`` holds only to resume (its checkpoint, its on-disk client states); the bytes freed."""
    freed = 0
    for name in RESUME_ONLY:
        path = run_dir / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
        freed += sum(p.stat().st_size for p in files)
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return freed


def finish(run: PlannedRun, code: int, device: str, recorded: list[PlannedRun]) -> None:
    if code == 0 and run.finished:
        write_record(run.run_dir, run.record_dir, run.table, run.name, device)
        recorded.append(run)
        freed = free_run_dir(run.run_dir)
        print(f"campaign: recorded {run.table}/{run.name}" + (f" (its checkpoint and client states removed: "
              f"{freed / 2**20:.1f} MiB)" if freed else ""), flush=True)
    elif code == 130:
        print(f"campaign: cut off {run.table}/{run.name} (checkpoint kept: {run.checkpointed})", flush=True)
    elif (message := diverged(run.run_dir, code)) is not None:
        write_failure(run.record_dir, message, run.config, run.table, run.name, device, code)
        recorded.append(run)
        free_run_dir(run.run_dir)
        print(f"campaign: diverged {run.table}/{run.name} (exit {code}: {short_cause(message)}); failure recorded "
              f"in {run.record_dir / FAILED}", flush=True)
    else:
        print(f"campaign: {run.table}/{run.name} FAILED (exit {code}); its log ends:\n{log_tail(run)}", flush=True)


def campaign(runs: list[PlannedRun], minutes: float, jobs: int, device: str,
             grace: float = GRACE_SECONDS, fit: bool = False) -> list[PlannedRun]:
    """Run the ``runs`` not done in order, ``jobs`` at a time, until done or ``minutes`` have passed; the runs
    recorded (failure records included). Ctrl-C cuts off the running ones as the deadline does. ``fit``: pass over
    a run whose other seeds' records took longer than the minutes left (benchmarks/campaign_fit.py), said."""
    deadline = time.monotonic() + minutes * 60
    # a campaign started in the background of a non-interactive shell inherits SIGINT ignored: Ctrl-C (kill -INT)
    # then neither cut the runs off nor packed, and a run stopped by hand was followed by the next one
    signal.signal(signal.SIGINT, signal.default_int_handler)
    queue = [r for r in runs if not r.done]
    running: dict[PlannedRun, subprocess.Popen] = {}
    recorded: list[PlannedRun] = []
    try:
        while queue or running:
            while queue and len(running) < jobs and time.monotonic() < deadline:
                run = queue.pop(0)
                if fit:
                    starts, why = fit_verdict(run, runs, deadline - time.monotonic())
                    print(f"campaign: {why}", flush=True)
                    if not starts:
                        continue
                running[run] = start(run)
            for run, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[run]
                    finish(run, proc.returncode, device, recorded)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("campaign: interrupted; cutting off the running runs", flush=True)
    if running:
        stop_all(running, grace)
        for run, proc in running.items():
            finish(run, proc.wait(), device, recorded)
    return recorded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["plan", "run", "tables", "record-failed"])
    parser.add_argument("--tables-file", type=Path, default=TABLES_FILE)
    parser.add_argument("--results", type=Path, default=RESULTS_ROOT, help="where records go")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "campaign", help="the runs' directories")
    parser.add_argument("--table", action="append", help="only these tables (repeat)")
    parser.add_argument("--minutes", type=float, help="run: stop starting runs and cut off running ones after this")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--fit", action="store_true",
                        help="run: start a run only where its other seeds' records took less than the minutes left")
    parser.add_argument("--set", action="append", default=[], dest="sets", help="KEY=VALUE for every run")
    parser.add_argument("--pack", type=Path, help="run: write new records and unfinished checkpoints here")
    parser.add_argument("--unpack", type=Path, help="run: first take an earlier campaign's archive")
    parser.add_argument("--grace", type=float, default=GRACE_SECONDS, help="seconds a cut-off run gets to checkpoint")
    parser.add_argument("--write", type=Path, help="tables: rewrite the generated tables in this file")
    parser.add_argument("--check", type=Path, help="tables: exit 1 if this file's generated tables are stale")
    args = parser.parse_args(argv)
    try:
        tables = load_tables(args.tables_file)
        if args.command == "tables":
            return tables_command(tables, args)
        extra = parse_sets(args.sets)
        if args.command == "run" and (args.minutes is None or args.minutes < 0 or args.jobs < 1):
            raise ConfigError("run needs --minutes M (M >= 0) and --jobs N (N >= 1)")
        if args.unpack:
            counts = unpack(args.unpack, args.results, args.work)
            print(f"campaign: unpacked {args.unpack}: {counts['records']} records, {counts['checkpoints']} checkpoints")
        if args.command == "run":  # a tuned table runs only values its tuning records chose
            problems = tuned_sweep_problems(tables, args.results, args.table, require_chosen=True)
            if problems:
                raise ConfigError("\n  ".join(["a tuned table cannot run yet:", *problems]))
        runs = planned_runs(tables, args.work, args.results, extra, args.table)
        if args.command == "run":
            runs = with_weights(runs, chosen=bool(args.table))
    except (ConfigError, ValueError, OSError) as err:
        print(f"campaign: error: {err}", file=sys.stderr)
        return 2
    if args.command == "plan":
        print(plan_text(runs))
        from campaign_stale import record_changes

        for run in runs:  # a record that its sweep no longer plans (tables --check fails on it)
            if diff := record_changes(run):
                print(f"of another config: {run.table}/{run.name} ({diff}); delete its record to re-make it")
        return 0
    device = str(extra.get("device", "cpu"))
    if args.command == "record-failed":
        record_failed(runs, device)
        print(plan_text(runs))
        return 0
    campaign(runs, args.minutes, args.jobs, device, args.grace, args.fit)
    print(plan_text(runs))
    if args.pack:
        records = [(f"{r.table}/{r.name}", path) for r in runs
                   for path in (r.record_dir / "results.json", r.record_dir / FAILED)
                   if path.is_file() and not committed(path)]
        unfinished = [(f"{r.table}/{r.name}", r.run_dir) for r in runs if not r.done and r.checkpointed]
        counts = pack(args.pack, records, unfinished)
        print(f"campaign: packed {args.pack}: {counts['records']} records, {counts['checkpoints']} checkpoints, "
              f"{counts['bytes'] / 1e6:.1f} MB")
    return 0


def with_weights(runs: list[PlannedRun], chosen: bool) -> list[PlannedRun]:
    """The runs whose ``model.weights`` file is here. A table named by --table whose file is missing is refused
    before any run starts; with no --table, such a table's runs are left out, said on stdout."""
    missing = without_weights(runs)
    advice = "make the file (the table's sweep file says how) or copy it to that path"
    if chosen and missing:
        raise ConfigError("; ".join(f"table {t!r}: its runs' model.weights '{w}' is not a file under {ROOT}"
                                    for t, w in missing.items()) + f": {advice}, or leave the table out")
    for table, weights in missing.items():
        print(f"campaign: table {table!r} left out: its model.weights '{weights}' is not a file under {ROOT} "
              f"({advice})", flush=True)
    return [r for r in runs if r.done or r.table not in missing]


def record_failed(runs: list[PlannedRun], device: str) -> list[PlannedRun]:
    """Failure records for the runs not done that diverged under an earlier campaign: the log ends with the
    divergence's stop message (cfl printed it last and exited 3) and the run directory's checkpoint is of the
    planned config (the log is this config's). The machine is this one's (the run's own was not kept)."""
    found = []
    for run in runs:
        message = None if run.done or run.finished else diverged(run.run_dir, None)
        if message is None:
            continue
        if not run.checkpointed:
            print(f"campaign: {run.table}/{run.name}: its log ends with a divergence but its run directory holds no "
                  f"checkpoint of the planned config (the sweep changed?); not recorded", flush=True)
            continue
        write_failure(run.record_dir, message, run.config, run.table, run.name, device)
        found.append(run)
        print(f"campaign: diverged {run.table}/{run.name} ({short_cause(message)}); failure recorded in "
              f"{run.record_dir / FAILED}", flush=True)
    print(f"campaign: {len(found)} failure record(s) written", flush=True)
    return found


def committed(path: Path) -> bool:
    """Whether git tracks ``path`` (a record already in the repository need not travel)."""
    found = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=ROOT, capture_output=True)
    return found.returncode == 0


def tables_command(tables: dict, args: argparse.Namespace) -> int:
    from campaign_record_checks import inconsistent_records
    from campaign_stale import stale_records

    problems = (tuned_sweep_problems(tables, args.results) + inconsistent_records(args.results, tables)
                + stale_records(tables, args.results))
    for problem in problems:
        print(f"campaign: {problem}", file=sys.stderr)
    if args.write and problems:
        print(f"campaign: {args.write} not written: a tuned sweep differs from its tuning records, or a record from "
              "itself or from its sweep's config", file=sys.stderr)
        return 2
    if args.write:
        write_tables(args.write, tables, args.results)
        print(f"campaign: wrote the generated tables into {args.write}")
        return 0
    if args.check:
        stale = check_tables(args.check, tables, args.results)
        for name in stale:
            print(f"campaign: {args.check}: table {name} differs from its records; run "
                  f"`python benchmarks/campaign.py tables --write {args.check}`", file=sys.stderr)
        return 1 if stale or problems else 0
    from campaign_tables import render_tables

    print(render_tables(tables, args.results))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
