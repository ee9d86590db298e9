"""Failure records: a campaign run that diverged is a result of its table ("this value diverges here"), recorded,
not lost and not rerun.

A run *diverged* when ``cfl run`` stopped it with exit code 3 on non-finite values (docs/reliability.md,
"Non-finite values"): its stop message (the ``cfl:`` line its log ends with) names a non-finite loss or update,
a non-finite global model after the server step, or a hook that made non-finite values. Such a run gets
``benchmarks/results/<table>/<run name>/failed.json``: the exit code, the stop message, its short cause, the
resolved config (as a record's ``config``) and the ``record`` block of a record (table, run, commit, machine).
Every other failure (a crash, exit 1, a hook that raised, a lost lock, a kill) stays unrecorded and is reported,
so that the next campaign runs it again. ``cfl report`` never reads a failure record (it reads ``results.json``);
a table's region lists them under the table, and a tuning table counts a failed grid point as measured and never
chooses it (benchmarks/campaign_tuning.py). Delete a ``failed.json`` to run the point again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign_records import record_block, write_json

if TYPE_CHECKING:  # the campaign puts the checkout on sys.path (campaign_plan.py); nothing else is needed here
    from cfl.config.keys import Config

FAILED = "failed.json"
#: the exit code of a run stopped on non-finite values (cfl/app/single_run.py's EXIT_NONFINITE)
EXIT_DIVERGED = 3
#: what a stop message of docs/reliability.md's "Non-finite values" says, and no other exit-3 stop does
DIVERGENCE = ("non-finite loss or update", "non-finite global model", "made non-finite values")
_WHERE = re.compile(r"at task (\d+) \(0-based\), round (\d+) of the task")
_BOUND = re.compile(r"method (\S+)'s penalty has weight \S+ on parameter .*?here (\S+) > (\S+?):")
_HOOK = re.compile(r"hook (\w+): made non-finite values")


def log_path(run_dir: Path) -> Path:
    """The log a campaign keeps beside a run's directory (``<run name>.log``, every attempt appended)."""
    return run_dir.parent / f"{run_dir.name}.log"


def stop_message(log_text: str, last_line_only: bool = False) -> str | None:
    """The log's last ``cfl:`` line (the message a stopped run ends with); ``last_line_only``: only where it is
    the log's last non-empty line (no later attempt wrote anything)."""
    lines = [line for line in log_text.splitlines() if line.strip()]
    if last_line_only:
        lines = lines[-1:]
    found = [line for line in lines if line.startswith("cfl: ")]
    return found[-1][len("cfl: "):].strip() if found else None


def is_divergence(message: str | None) -> bool:
    return message is not None and any(marker in message for marker in DIVERGENCE)


def short_cause(message: str) -> str:
    """A stop message in a few words: what went non-finite (the penalty's lr x weight bound, the hook), where."""
    where = _WHERE.search(message)
    at = f" at task {where.group(1)} (0-based), round {where.group(2)}" if where else ""
    if bound := _BOUND.search(message):
        return f"{bound.group(1)}'s penalty: lr x weight = {bound.group(2)} > {bound.group(3)}{at}"
    if hook := _HOOK.search(message):
        return f"hook {hook.group(1)} made non-finite values{at}"
    if "non-finite global model" in message:
        return f"non-finite global model after the server step{at}"
    if "non-finite loss or update" in message:
        return f"non-finite loss or update{at}"
    return message.split(";")[0][:120]


def diverged(run_dir: Path, code: int | None) -> str | None:
    """The stop message of a run that diverged, else None. ``code``: the exit code of the process that just ended;
    None for a run found later, which counts only where its log ends with the divergence's stop message (cfl
    prints it last and exits 3)."""
    path = log_path(run_dir)
    if (code is not None and code != EXIT_DIVERGED) or not path.is_file():
        return None
    message = stop_message(path.read_text(errors="replace"), last_line_only=code is None)
    return message if is_divergence(message) else None


def write_failure(record_dir: Path, message: str, config: Config, table: str, run_name: str, device: str,
                  code: int = EXIT_DIVERGED) -> Path:
    """``failed.json`` of a diverged run."""
    failure = {"failed": True, "exit_code": code, "stop": message, "cause": short_cause(message),
               "config": json.loads(json.dumps(config.to_dict())), "record": record_block(table, run_name, device)}
    return write_json(record_dir / FAILED, failure)


def load_failures(results_root: Path, table: str) -> list[dict[str, Any]]:
    """The failure records of ``table``, in its run names' order."""
    return [json.loads(p.read_text()) for p in sorted((results_root / table).rglob(FAILED))]


def failures_text(failures: list[dict[str, Any]]) -> str:
    """Markdown lines under a table: each diverged run's name and short cause (never a row with numbers)."""
    if not failures:
        return ""
    lines = [f"Diverged ({len(failures)} run{'s' if len(failures) > 1 else ''}, exit 3, no numbers: failure records "
             f"`failed.json`):", ""]
    lines += [f"- {f['record']['run']}: {short_cause(f['stop'])}" for f in failures]
    return "\n".join(lines)
