"""``metrics.jsonl``: one JSON object per round and per evaluation, appended and flushed as the run goes.

Each line has a ``kind``: ``"round"`` (``task``, ``round``, ``clients``, ``train_loss`` (the task loss: each
client's mean over its steps of the step's cross-entropy, averaged over the kept clients; no penalty or extra
loss, in every engine path: docs/concepts.md), this round's
``round_upload_bytes`` / ``round_download_bytes`` and the running ``upload_bytes`` / ``download_bytes``, as
W&B receives them, and two timings: ``seconds``, the round's wall time (its training, aggregation and an
evaluation made in it), and ``wall_seconds``, the run's wall time at the line, the part before a resume
included) or ``"evaluation"`` (``acc`` per seen task, ``mean_acc``, ``final``). An evaluation made in a round
comes just before that round's line.

The timings (:data:`TIMING_KEYS`) measure the machine, not the run: a resumed run's lines equal an uninterrupted
run's in every other value (:func:`without_timing`), as ``benchmarks/bit_for_bit.py`` compares results.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from cfl.report.files import json_line

ROUND, EVALUATION = "round", "evaluation"
#: the keys of a line that measure the machine (a round's seconds, the run's wall seconds), not the run
TIMING_KEYS = ("seconds", "wall_seconds")


def without_timing(obj: dict[str, Any]) -> dict[str, Any]:
    """A line's object less its :data:`TIMING_KEYS`: what two runs of one config must agree on."""
    return {k: v for k, v in obj.items() if k not in TIMING_KEYS}


def line_kind(obj: dict[str, Any]) -> str:
    """A line's kind (lines without one are evaluations, as every line once was)."""
    return obj.get("kind", EVALUATION)


def metrics_line(kind: str, record: dict[str, Any]) -> str:
    return json_line({"kind": kind, **record})


def lines_before_checkpoint(lines: list[str], rounds: int, evaluations: int) -> list[str] | None:
    """The prefix of ``lines`` holding exactly ``rounds`` round lines and ``evaluations`` evaluation lines
    (what was written up to a checkpoint taken after global round ``rounds``); None if the file is short."""
    want = {ROUND: rounds, EVALUATION: evaluations}
    seen = {ROUND: 0, EVALUATION: 0}
    for i, line in enumerate(lines):
        if seen == want:
            return lines[:i]
        kind = line_kind(json.loads(line))
        seen[kind] += 1
        if seen[kind] > want[kind]:
            return None
    return lines if seen == want else None


def readable_lines(path: Path) -> list[str]:
    """The complete lines of ``path`` up to the first one that is not UTF-8 JSON: a line torn by a kill (no
    newline) or holding bytes a kill left (a partly written block of a file system) ends what can be read."""
    lines: list[str] = []
    for raw in path.read_bytes().split(b"\n")[:-1] if path.is_file() else []:  # the last part has no newline
        try:
            line = raw.decode("utf-8")
            json.loads(line)
        except ValueError:  # UnicodeDecodeError and JSONDecodeError both
            break
        lines.append(line + "\n")
    return lines


def keep_lines_up_to(path: Path, rounds: int, evaluations: list[dict[str, Any]]) -> str:
    """The text of ``path`` cut back to a checkpoint after ``rounds`` global rounds with these evaluations.

    If lines written before the checkpoint are missing (a file deleted or cut by hand), the evaluation
    lines are rebuilt from the checkpoint and a warning says that round lines are lost.
    """
    kept = lines_before_checkpoint(readable_lines(path), rounds, len(evaluations))
    if kept is not None:
        return "".join(kept)
    warnings.warn(f"{path} lacks lines written before the checkpoint (after round {rounds}); its evaluation "
                  f"lines are rebuilt from the checkpoint, the per-round lines up to round {rounds} are lost",
                  stacklevel=2)
    return "".join(metrics_line(EVALUATION, e) for e in evaluations)


class MetricsWriter:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _append(self, text: str) -> None:
        with self.path.open("a") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def round_end(self, record: dict[str, Any]) -> None:
        self._append(metrics_line(ROUND, record))

    def evaluation(self, record: dict[str, Any]) -> None:
        self._append(metrics_line(EVALUATION, record))

    def task_end(self, task: int, record: dict[str, Any]) -> None:
        pass
