"""Weights & Biases logging (offline by default). Any W&B failure warns and never stops a run."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any


class WandbLogger:
    """Logs the resolved config, per-round metrics, evaluations, the accuracy matrix and the plots."""

    def __init__(self, mode: str, project: str, entity: str | None, group: str | None, name: str | None,
                 tags: list[str], config: dict[str, Any], out_dir: Path, run_id: str | None = None) -> None:
        self.run = None
        self.run_id = run_id
        if mode == "disabled":
            return
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(mode=mode, project=project, entity=entity, group=group, name=name,
                                  tags=tags, config=config, dir=str(out_dir), id=run_id,
                                  resume="allow" if run_id else None, reinit="finish_previous",
                                  settings=wandb.Settings(init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", 30))))
            self.run_id = self.run.id
        except Exception as err:  # noqa: BLE001 - W&B must never stop a run
            self._fail("init", err)

    def _fail(self, what: str, err: BaseException) -> None:
        warnings.warn(f"W&B {what} failed ({type(err).__name__}: {err}); continuing with local outputs only",
                      stacklevel=3)
        self.run = None

    def _log(self, data: dict[str, Any], step: int | None = None) -> None:
        if self.run is None:
            return
        try:
            self.run.log(data, step=step)
        except Exception as err:  # noqa: BLE001
            self._fail("log", err)

    def round_end(self, record: dict[str, Any]) -> None:
        self._log({k: v for k, v in record.items() if k != "round"}, step=record["round"])

    def evaluation(self, record: dict[str, Any]) -> None:
        data = {f"acc/task_{j}": a for j, a in record["acc"].items()}
        data["acc/mean_seen"] = record["mean_acc"]
        self._log(data, step=record["round"])

    def task_end(self, task: int, record: dict[str, Any]) -> None:
        pass

    def finish(self, results: dict[str, Any], plots: list[Path]) -> None:
        if self.run is None:
            return
        try:
            import wandb

            matrix = results["acc_matrix"]
            columns = ["after_task"] + [f"task_{j}" for j in range(len(matrix))]
            table = wandb.Table(columns=columns, data=[[i] + row for i, row in enumerate(matrix)])
            self.run.log({"acc_matrix": table, **{f"plot/{p.stem}": wandb.Image(str(p)) for p in plots}})
            for key in ("acc", "fgt", "bwt", "wall_seconds", "upload_bytes", "download_bytes"):
                self.run.summary[key] = results[key]
            self.run.finish()
        except Exception as err:  # noqa: BLE001
            self._fail("finish", err)
