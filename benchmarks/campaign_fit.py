"""Which runs a campaign can finish in the minutes it has left (``run --fit``): a run started too late to finish
is cut off with a checkpoint that only a later campaign on a machine holding the pack can resume; where the next
campaign is on a fresh machine without it, its core-hours are lost. ``--fit`` starts a run only where its
expected wall time fits before the deadline, and says which it passed over.

The expectation is the longest ``wall_seconds`` among the committed records of the same table and label (the
run's other seeds), so it is the cost on the machines and under the contention those records had; a run with no
such record has no estimate and starts (said), as does one with a checkpoint here (its progress is kept by the
pack)."""

from __future__ import annotations

import json
from pathlib import Path

from campaign_plan import PlannedRun


def _wall_seconds(record_dir: Path) -> float | None:
    path = record_dir / "results.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("wall_seconds")
    return float(value) if isinstance(value, (int, float)) else None


def expected_seconds(run: PlannedRun, runs: list[PlannedRun]) -> float | None:
    """The longest wall time among the records of ``run``'s table and label (other seeds); None without one."""
    walls = [w for r in runs if r.table == run.table and r.config.label == run.config.label and r is not run
             if (w := _wall_seconds(r.record_dir)) is not None]
    return max(walls) if walls else None


def fit_verdict(run: PlannedRun, runs: list[PlannedRun], seconds_left: float) -> tuple[bool, str]:
    """Whether ``run`` starts under ``--fit`` with ``seconds_left`` before the deadline, and a line saying why."""
    label = f"{run.table}/{run.name}"
    if run.checkpointed:
        return True, f"{label}: resumed from its checkpoint (no estimate of what is left of it)"
    expected = expected_seconds(run, runs)
    if expected is None:
        return True, f"{label}: no record of its other seeds, so no estimate: started"
    why = (f"its other seeds' records took up to {expected / 60:.0f} min, {seconds_left / 60:.0f} min are left")
    if expected <= seconds_left:
        return True, f"{label}: {why}"
    return False, f"{label} not started (--fit): {why}"
