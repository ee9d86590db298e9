"""Weights & Biases logging (offline by default). Any W&B failure warns and never stops a run.

See docs/wandb.md: group, name, tags and job type (:mod:`cfl.report.wandb_names`), metrics against the
global round, and the run's output files as an artifact.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cfl.config.keys import Config
from cfl.records.run_dir import CHECKPOINT
from cfl.report.wandb_names import default_group, default_name, default_tags, flat
from cfl.report.wandb_sweep import PARAM_PATH_ENV, RunSource

#: logged with every record; W&B plots every metric against it (``define_metric``)
STEP_METRIC = "round"
#: the output files of a run logged as its artifact (plots are added by name; the checkpoint when asked)
ARTIFACT_FILES = ("results.json", "metrics.jsonl", "config.yaml")
GROUP_FILE = Path("wandb") / "cfl-group.txt"
NAME_FILE = Path("wandb") / "cfl-name.txt"
#: where W&B stages an artifact's files (``$WANDB_DATA_DIR/artifacts/staging``) unless the user set it: the run's
#: ``wandb/`` directory, beside the offline run that names them (W&B's default is ``~/.local/share/wandb``)
DATA_DIR_ENV = "WANDB_DATA_DIR"
SUMMARY_KEYS = ("acc", "fgt", "bwt", "aia", "fwt", "wall_seconds", "upload_bytes", "download_bytes")


def recorded_config(cfg: Config, sweep_params: dict[str, Any]) -> dict[str, Any]:
    """What W&B records as the run's config: the resolved config, plus each dotted sweep key with the value
    used (so that the sweep's parameter names find their values)."""
    resolved = cfg.to_dict()
    used = flat(resolved)
    return {**resolved, **{k: used[k] for k in sweep_params if "." in k and k in used}}


def run_group(cfg: Config, base: Config | None, out_dir: Path, resumed: bool) -> str:
    """The default group, kept in ``wandb/cfl-group.txt``: a resumed run (whose config file is no longer
    known) stays in the group it started in."""
    return _kept(out_dir / GROUP_FILE, resumed, lambda: default_group(cfg, base))


def run_name(cfg: Config, base: Config | None, out_dir: Path, resumed: bool) -> str:
    """The default name, kept in ``wandb/cfl-name.txt`` as the group is."""
    return _kept(out_dir / NAME_FILE, resumed, lambda: default_name(cfg, base))


def _kept(path: Path, resumed: bool, make: Callable[[], str]) -> str:
    if resumed and path.is_file():
        return path.read_text(encoding="utf-8").strip()
    value = make()
    path.parent.mkdir(exist_ok=True)
    path.write_text(value + "\n", encoding="utf-8")
    return value


@contextmanager
def staged_in(out_dir: Path) -> Iterator[None]:
    """Artifact files staged under the run's ``wandb/`` directory while the block runs (``$WANDB_DATA_DIR``,
    unless the user set it)."""
    if os.environ.get(DATA_DIR_ENV):
        yield
        return
    os.environ[DATA_DIR_ENV] = str((out_dir / "wandb").resolve())
    try:
        yield
    finally:
        os.environ.pop(DATA_DIR_ENV, None)


class WandbLogger:
    """Logs the resolved config, per-round metrics, evaluations, the accuracy matrix, plots and output files."""

    def __init__(self, cfg: Config, out_dir: Path, source: RunSource | None = None,
                 run_id: str | None = None) -> None:
        self.run = None
        self.run_id = run_id
        self.settings = w = cfg.wandb
        if w.mode == "disabled":
            return
        source = source or RunSource()
        config = recorded_config(cfg, source.sweep_params)
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            # cfl applied the sweep's parameters itself; W&B would otherwise record the agent's raw values
            os.environ.pop(PARAM_PATH_ENV, None)
            resumed = bool(run_id)
            self.run = wandb.init(mode=w.mode, project=w.project, entity=w.entity,
                                  group=w.group or run_group(cfg, source.base, out_dir, resumed),
                                  job_type=w.job_type,
                                  name=w.name or run_name(cfg, source.base, out_dir, resumed),
                                  tags=default_tags(cfg), config=config,
                                  dir=str(out_dir), id=run_id, resume="allow" if run_id else None,
                                  reinit="finish_previous",
                                  settings=wandb.Settings(init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", 30))))
            self.run_id = self.run.id
            self.run.define_metric(STEP_METRIC)
            self.run.define_metric("*", step_metric=STEP_METRIC)
            self._check_recorded(config)
        except Exception as err:  # noqa: BLE001 - W&B must never stop a run
            self._fail("init", err)

    def _check_recorded(self, config: dict[str, Any]) -> None:
        """Warn when W&B's config differs from the one used (e.g. a sweep's raw values merged in)."""
        recorded = {k: v for k, v in dict(self.run.config).items() if k != "_wandb"}
        wrong = sorted(k for k in recorded.keys() | config.keys() if recorded.get(k) != config.get(k))
        if wrong:
            warnings.warn(f"W&B recorded config keys {wrong} with values other than the ones this run uses "
                          f"({', '.join(f'{k}={config.get(k)!r}' for k in wrong)}); trust config.yaml",
                          stacklevel=3)

    def _fail(self, what: str, err: BaseException) -> None:
        warnings.warn(f"W&B {what} failed ({type(err).__name__}: {err}); continuing with local outputs only",
                      stacklevel=3)
        self.run = None

    def _log(self, data: dict[str, Any], step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log({**data, STEP_METRIC: step}, step=step)
        except Exception as err:  # noqa: BLE001
            self._fail("log", err)

    def round_end(self, record: dict[str, Any]) -> None:
        self._log({k: v for k, v in record.items() if k != "round"}, step=record["round"])

    def evaluation(self, record: dict[str, Any]) -> None:
        """Each task's accuracy and their mean over the seen tasks, as ``acc/mean_seen``, ``mean_acc`` and
        ``acc`` (the metric a sweep optimises: its history lets early termination compare runs; after the last
        task it is the run's ACC), so that the last values logged are the final ones."""
        data = {f"acc/task_{j}": a for j, a in record["acc"].items()}
        data["acc/mean_seen"] = data["mean_acc"] = data["acc"] = record["mean_acc"]
        self._log(data, step=record["round"])

    def task_end(self, task: int, record: dict[str, Any]) -> None:
        pass

    def finish(self, results: dict[str, Any], out_dir: Path, plots: list[Path]) -> None:
        """The accuracy matrix, plots, summary and (``wandb.log_artifacts``) the output files; then finish."""
        if self.run is None:
            return
        try:
            import wandb

            with staged_in(out_dir):  # the table is an artifact too
                matrix = results["acc_matrix"]
                columns = ["after_task"] + [f"task_{j}" for j in range(len(matrix))]
                table = wandb.Table(columns=columns, data=[[i] + row for i, row in enumerate(matrix)])
                self.run.log({"acc_matrix": table, **{f"plot/{p.stem}": wandb.Image(str(p)) for p in plots}})
                for key in SUMMARY_KEYS:
                    self.run.summary[key] = results[key]
                for key, value in results.get("schedule", {}).items():  # under a schedule (docs/concepts.md)
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        self.run.summary[f"schedule/{key}"] = value
                for cls, acc in results.get("class_acc", {}).items():  # class-incremental runs
                    self.run.summary[f"class_acc/{cls}"] = acc
                if self.settings.log_artifacts:
                    self.run.log_artifact(self._artifact(wandb, out_dir, plots))
                self.run.finish()
        except Exception as err:  # noqa: BLE001
            self._fail("finish", err)

    def _artifact(self, wandb: Any, out_dir: Path, plots: list[Path]) -> Any:
        artifact = wandb.Artifact(f"run-{self.run.id}", type="cfl-run",
                                  description="results.json, metrics.jsonl, config.yaml and plots of a cfl run")
        names = [*ARTIFACT_FILES, *(p.name for p in plots)]
        if self.settings.log_checkpoint:
            names.append(CHECKPOINT)
        for name in names:
            artifact.add_file(str(out_dir / name), name=name)
        return artifact
