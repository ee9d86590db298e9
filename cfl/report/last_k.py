""""Mean over the last k evaluations" (``cfl report --last-k K``): a steadier ACC than the last evaluation alone.

What is averaged is each run's ``mean_acc`` of its ``metrics.jsonl`` evaluation lines (the mean accuracy over the
tasks seen so far, %; the last evaluation of a round counts):

- in tables, the ACC column becomes the mean of a run's last K evaluations (then mean ± std over seeds as
  always); the last K evaluations may reach back into an earlier task, where fewer tasks were seen (say so with
  the rounds per task and evaluation interval at hand). A run with fewer than K evaluations, or no readable
  ``metrics.jsonl``, is left out of its cell with a warning (the cell says "(n of m runs)");
- in ``accuracy_curves.png``, each run's curve at an evaluated round is the mean of its evaluations at that round
  and the K - 1 evaluations before it (fewer at the start), before the mean, minimum and maximum over seeds.
"""

from __future__ import annotations

import json
import statistics
import sys

from cfl.config.keys import ConfigError
from cfl.report.groups import Run
from cfl.report.jsonl import EVALUATION, line_kind


def read_mean_accuracy(run: Run) -> dict[int, float] | None:
    """``mean_acc`` by global round from the run's ``metrics.jsonl`` (the last evaluation of a round counts),
    or None with a warning when the file is missing or unreadable."""
    path = run.dir / "metrics.jsonl"
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        print(f"cfl: warning: {path} left out of the accuracy curves ({type(err).__name__}: {err})",
              file=sys.stderr)
        return None
    return {int(e["round"]): float(e["mean_acc"]) for e in lines if line_kind(e) == EVALUATION}


def check_k(k: int | None) -> None:
    if k is not None and k < 1:
        raise ConfigError(f"--last-k must be at least 1 (1: the last evaluation alone), got {k}")


def trailing_means(curve: dict[int, float], k: int) -> dict[int, float]:
    """At each round of ``curve``, the mean of its value there and at the k - 1 evaluated rounds before it."""
    rounds = sorted(curve)
    return {r: statistics.fmean(curve[q] for q in rounds[max(0, i - k + 1): i + 1]) for i, r in enumerate(rounds)}


def last_k_mean(run: Run, k: int) -> float | None:
    """The mean of the run's last ``k`` evaluations' ``mean_acc``, or None (with a warning) with fewer of them."""
    curve = read_mean_accuracy(run)
    if curve is None:
        return None
    if len(curve) < k:
        print(f"cfl: warning: {run.path} left out of 'ACC last {k}': {len(curve)} evaluation(s) in its metrics.jsonl",
              file=sys.stderr)
        return None
    return statistics.fmean(curve[r] for r in sorted(curve)[-k:])
