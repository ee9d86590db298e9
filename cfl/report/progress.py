"""A tqdm progress bar per task showing the round and the latest accuracy.

Bars are drawn only on a terminal: when stderr is not a TTY (a log file, a pipe, ``make demo > log``)
tqdm's ``disable=None`` turns them off, so logs hold the summary lines and no carriage-return noise.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

from cfl.task_numbering import task_name


class ProgressBars:
    def __init__(self, num_tasks: int, rounds_per_task: int, method: str, enabled: bool = True) -> None:
        self.num_tasks, self.rounds, self.method, self.enabled = num_tasks, rounds_per_task, method, enabled
        self.bar: tqdm | None = None
        self.last_acc: float | None = None

    def _bar(self, task: int) -> tqdm:
        if self.bar is None:
            self.bar = tqdm(total=self.rounds, desc=f"{self.method} {task_name(task, self.num_tasks)}",
                            unit="round", leave=True, disable=None if self.enabled else True, dynamic_ncols=True)
        return self.bar

    def round_end(self, record: dict[str, Any]) -> None:
        bar = self._bar(record["task"])
        bar.update(1)
        post = {"loss": f"{record['train_loss']:.3f}"}
        if self.last_acc is not None:
            post["acc"] = f"{self.last_acc:.1f}"
        bar.set_postfix(post, refresh=False)

    def evaluation(self, record: dict[str, Any]) -> None:
        self.last_acc = record["mean_acc"]

    def task_end(self, task: int, record: dict[str, Any]) -> None:
        bar = self._bar(task)
        bar.set_postfix({"acc": f"{record['mean_acc']:.1f}"})
        bar.close()
        self.bar, self.last_acc = None, None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
