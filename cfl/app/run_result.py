"""What ``cfl.run`` and ``cfl.resume`` return: the run's results (``results.json`` as a dict), its directory and
its accuracy curves, read from the ``metrics.jsonl`` the run wrote (docs/python-api.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl.report.jsonl import EVALUATION, line_kind, readable_lines


@dataclass(frozen=True)
class Curves:
    """The run's evaluations in order, one entry per evaluation (every ``eval_every`` rounds and at each
    task end): ``round`` (global round, from 1), ``task`` (the task being trained, from 0), ``final`` (the
    task-end evaluation), ``mean_acc`` (%, over the seen tasks) and ``acc[j]``: task ``j``'s accuracy (%)
    at each evaluation, ``None`` before task ``j`` was seen (matplotlib draws no point there)."""

    round: list[int]
    task: list[int]
    final: list[bool]
    mean_acc: list[float]
    acc: list[list[float | None]]  # (num_tasks, evaluations)


def read_curves(metrics: Path, num_tasks: int) -> Curves:
    """The curves of the evaluation lines of a ``metrics.jsonl``."""
    evaluations = [e for e in map(json.loads, readable_lines(metrics)) if line_kind(e) == EVALUATION]
    return Curves(round=[int(e["round"]) for e in evaluations], task=[int(e["task"]) for e in evaluations],
                  final=[bool(e["final"]) for e in evaluations], mean_acc=[float(e["mean_acc"]) for e in evaluations],
                  acc=[[e["acc"].get(str(j)) for e in evaluations] for j in range(num_tasks)])


class RunResult(dict[str, Any]):
    """The results of a run: a dict with the content of ``results.json`` (``res["acc"]``, ``res["acc_matrix"]``,
    ...), plus ``run_dir`` (the run directory, a :class:`Path`) and ``curves`` (:class:`Curves`)."""

    def __init__(self, results: dict[str, Any], run_dir: Path) -> None:
        super().__init__(results)
        self.run_dir = Path(run_dir)
        self.curves = read_curves(self.run_dir / "metrics.jsonl", int(results["num_tasks"]))
