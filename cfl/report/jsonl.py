"""``metrics.jsonl``: one JSON object per evaluation, appended and flushed as the run goes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cfl.report.files import json_line


class MetricsWriter:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def round_end(self, record: dict[str, Any]) -> None:
        pass

    def evaluation(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json_line(record))
            fh.flush()
            os.fsync(fh.fileno())

    def task_end(self, task: int, record: dict[str, Any]) -> None:
        pass
