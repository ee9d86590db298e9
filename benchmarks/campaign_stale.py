"""Each committed record checked against its sweep: a record whose saved config differs from the config its
sweep gives today (a default changed since it was made, or the sweep was edited) would stand in the table under
a label that now means another run. ``tables --check`` fails and ``tables --write`` refuses (nothing written)
while such a record is there; ``plan`` counts them. Keys added to cfl after a record was made read as the value
it ran with (``cfl/records/saved_configs.py``), and keys that change no result (``threads``, W&B, ...) are
not compared, as for ``cfl run --resume``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from campaign_plan import PlannedRun, planned_runs

from cfl.engine.stores.checkpoint import config_changes


def record_changes(run: PlannedRun) -> str:
    """How ``run``'s record's config differs from the planned one ('' when it does not, or there is no record)."""
    if not run.recorded:
        return ""
    saved = json.loads((run.record_dir / "results.json").read_text()).get("config") or {}
    return config_changes(saved, run.config).replace(" in the checkpoint,", " in the record,")


def stale_records(tables: dict[str, Any], results_root: Path) -> list[str]:
    """One line per record of ``tables`` that its sweep no longer plans: its path, the differences and the fix."""
    with tempfile.TemporaryDirectory(prefix="cfl-campaign-stale-") as work:
        runs = planned_runs(tables, Path(work), results_root)
        return [f"{run.record_dir / 'results.json'} is of another config than its sweep plans today ({diff}): "
                f"delete it and run the campaign to re-make it, or set the record's values in the sweep"
                for run in runs if (diff := record_changes(run))]
