"""Each committed record checked against itself: its summary (ACC, FGT, BWT, AIA) recomputed from its own
``acc_matrix`` (the formulas of ``cfl/metrics/matrix.py``, as ``build_results`` writes them), so a record whose
matrix or summary was edited by hand stops ``tables --check`` and ``tables --write``.

Only a synchronous run's summary is the matrix's; under another schedule the summary comes from the
evaluations in ``metrics.jsonl`` (``cfl/metrics/asynchronous.py``), which a record does not keep, and its matrix
is only checked to be square with the task count.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cfl.metrics.matrix import average_accuracy, average_incremental_accuracy, backward_transfer, forgetting

#: the summary keys recomputed from the matrix, and how
FROM_MATRIX = {"acc": average_accuracy, "fgt": forgetting, "bwt": backward_transfer,
               "aia": average_incremental_accuracy}
#: the largest difference between a stored value and its recomputation (float64 sums in another order)
TOLERANCE = 1e-9


def record_problems(record: dict[str, Any]) -> list[str]:
    """What in ``record`` disagrees with its own ``acc_matrix`` (empty: nothing)."""
    matrix, tasks = record.get("acc_matrix"), record.get("num_tasks")
    if not isinstance(matrix, list) or tasks is None:
        return []
    if len(matrix) != tasks or any(len(row) != tasks for row in matrix):
        return [f"acc_matrix is not {tasks} x {tasks} (num_tasks)"]
    schedule = (record.get("config") or {}).get("schedule") or {}
    done = record.get("tasks_completed") or 0
    if schedule.get("name", "synchronous") != "synchronous" or not done:
        return []
    problems = []
    for key, formula in FROM_MATRIX.items():
        stored, again = record.get(key), formula(matrix, done - 1)
        if stored is None or again is None:
            if stored != again:
                problems.append(f"{key} is {stored} but its acc_matrix gives {again}")
        elif not math.isclose(stored, again, rel_tol=0.0, abs_tol=TOLERANCE):
            problems.append(f"{key} is {stored:.6g} but its acc_matrix gives {again:.6g}")
    return problems


def inconsistent_records(results_root: Path, tables: dict[str, Any]) -> list[str]:
    """One line per record of ``tables`` that disagrees with itself: its path and what."""
    lines = []
    for name in tables:
        for path in sorted((results_root / name).rglob("results.json")):
            for problem in record_problems(json.loads(path.read_text())):
                lines.append(f"{path}: {problem} (a record edited by hand? re-make it)")
    return lines
