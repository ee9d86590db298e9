"""One run, end to end: checks, data, the round loop, and every output file."""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cfl.config import Config, ConfigError, dump_yaml, load_config, parse_overrides
from cfl.data.load import load_stream
from cfl.engine import checkpoint
from cfl.engine.runner import NonFiniteError, Runner
from cfl.engine.stop import RunStopped, StopRequest
from cfl.metrics.results import build_results
from cfl.report.files import atomic_write_bytes, atomic_write_json
from cfl.report.jsonl import MetricsWriter, keep_lines_up_to
from cfl.report.plots import write_plots
from cfl.report.progress import ProgressBars
from cfl.report.wandb_log import WandbLogger

OUTPUT_FILES = ("results.json", "metrics.jsonl", "config.yaml", "acc_matrix.png", "accuracy_curve.png",
                checkpoint.CHECKPOINT)
EXIT_NONFINITE = 3


def default_run_dir(cfg: Config) -> Path:
    method = cfg.method_label
    return Path("runs") / f"{cfg.stream.name}-{method}-{cfg.partition.name}-s{cfg.seed}"


def resolve_device(cfg: Config) -> torch.device:
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"'device: {cfg.device}' but no CUDA device is available to torch; use device: cpu")
    return torch.device(cfg.device)


def prepare_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse to clobber an earlier run's outputs unless ``overwrite``."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            unfinished = (out / checkpoint.CHECKPOINT).is_file() and not (out / "results.json").is_file()
            hint = f", or continue that unfinished run with: cfl run --resume {out}" if unfinished else ""
            raise ConfigError(f"run directory '{out}' already holds outputs; pass --overwrite to replace them "
                              f"or --out to choose another directory{hint}")
        for name in OUTPUT_FILES:
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "wandb", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)


def resume_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config of the run in ``run_dir`` (its config.yaml), with only result-neutral ``--set`` keys."""
    for key, _ in parse_overrides(overrides):
        if not checkpoint.is_resume_safe(key):
            raise ConfigError(f"--set {key} cannot be combined with --resume: it would change the results of a run "
                              f"that is half done (a resumed run keeps {run_dir}/config.yaml); allowed with --resume: "
                              f"{', '.join(checkpoint.RESUME_SAFE_KEYS)}. Start a new run with --out instead")
    if not Path(run_dir).is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run directory")
    if not (Path(run_dir) / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml in it; is it a cfl run directory?")
    try:
        return load_config(Path(run_dir) / "config.yaml", overrides)
    except ConfigError as err:
        if "unknown method" not in str(err):
            raise
        raise ConfigError(f"{err} (a run started with --plugin needs the same --plugin to resume)") from None


class Checkpointer:
    """``Runner.after_round``: checkpoint at task ends, every ``checkpoint_every`` rounds and when stopping."""

    def __init__(self, runner: Runner, out: Path, stop: StopRequest, wandb_run_id: str | None) -> None:
        self.runner, self.out, self.stop, self.wandb_run_id = runner, out, stop, wandb_run_id
        self.saved_round = -1

    def save(self) -> None:
        checkpoint.save(self.out, checkpoint.capture(self.runner, self.wandb_run_id))
        self.saved_round = self.runner.progress.global_round

    def __call__(self) -> None:
        prog, every = self.runner.progress, self.runner.cfg.checkpoint_every
        if prog.round_in_task == 0 or (every and prog.global_round % every == 0) or self.stop():
            self.save()


def execute(cfg: Config, out: Path | None = None, overwrite: bool = False, quiet: bool = False,
            resume: bool = False) -> dict[str, Any]:
    """Run ``cfg`` and write results.json, metrics.jsonl, config.yaml, plots and checkpoints into ``out``.

    ``resume``: continue the run in ``out`` from its checkpoint (``cfg`` from :func:`resume_config`).
    Raises :class:`RunStopped` after SIGINT/SIGTERM or non-finite values, with the last checkpoint kept.
    """
    started = time.perf_counter()
    device = resolve_device(cfg)
    out = Path(out) if out is not None else default_run_dir(cfg)
    saved = None
    if resume:
        saved = checkpoint.load(out)
        checkpoint.check_config(saved["config"], cfg, out)
        started -= saved["progress"]["wall_seconds"]
        checkpoint.remove_stale_temp_files(out)
    else:
        prepare_run_dir(out, overwrite)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    atomic_write_bytes(out / "config.yaml", dump_yaml(cfg).encode())
    stream = load_stream(cfg, device)
    method = cfg.method_label
    bars = ProgressBars(stream.num_tasks, cfg.rounds_per_task, method, enabled=not quiet)
    w = cfg.wandb
    logger = WandbLogger(w.mode, w.project, w.entity, w.group,
                         w.name or f"{cfg.stream.name}-{method}-{cfg.partition.name}-s{cfg.seed}",
                         w.tags, cfg.to_dict(), out, run_id=saved["wandb_run_id"] if saved else None)
    runner = Runner(cfg, stream, [bars, MetricsWriter(out / "metrics.jsonl"), logger], device)
    stop = StopRequest()
    saver = Checkpointer(runner, out, stop, logger.run_id)
    if saved is not None:
        checkpoint.restore(runner, saved)
        saver.saved_round = runner.progress.global_round
        keep_metrics_lines(out / "metrics.jsonl", runner.progress.global_round, runner.progress.evaluations)
    else:
        saver.save()  # round 0: a run killed at any later moment can be resumed
    runner.after_round, runner.should_stop = saver, stop
    try:
        with stop.installed():
            runner.run()
    except NonFiniteError as err:
        raise RunStopped(f"{err}. Stopped; the last checkpoint (after round {saver.saved_round}) is kept in "
                         f"{out}/{checkpoint.CHECKPOINT}", EXIT_NONFINITE) from None
    except KeyboardInterrupt:
        raise RunStopped(f"interrupted; the last checkpoint (after round {saver.saved_round}) is kept. Resume with: "
                         f"cfl run --resume {out}", 128 + signal.SIGINT) from None
    finally:
        bars.close()
    prog = runner.progress
    if stop() and prog.task < stream.num_tasks:
        raise RunStopped(f"stopped by {stop.name} after round {prog.global_round} (task {prog.task + 1}/"
                         f"{stream.num_tasks}); checkpoint saved. Resume with: cfl run --resume {out}",
                         128 + int(stop.signum))
    results = build_results(runner, time.perf_counter() - started)
    results["wandb_run_id"] = logger.run_id
    atomic_write_json(out / "results.json", results)
    plots = write_plots(results, runner.progress.evaluations, cfg.rounds_per_task, out)
    logger.finish(results, plots)
    results["wall_seconds"] = time.perf_counter() - started
    atomic_write_json(out / "results.json", results)
    if not quiet:
        print(summary(results, out), file=sys.stderr if quiet else sys.stdout)
    return results


def keep_metrics_lines(path: Path, rounds: int, evaluations: list[dict[str, Any]]) -> None:
    """After a resume, metrics.jsonl holds exactly the lines up to the checkpoint (later lines are redone)."""
    atomic_write_bytes(path, keep_lines_up_to(path, rounds, evaluations).encode())


def summary(results: dict[str, Any], out: Path) -> str:
    mb = 1024 * 1024
    return (f"{results['method']} on {results['stream']} ({results['partition']}, seed {results['seed']}): "
            f"ACC {results['acc']:.2f}%  FGT {results['fgt']:.2f}%  BWT {results['bwt']:.2f}%  "
            f"{results['rounds']} rounds, {results['wall_seconds']:.1f}s, "
            f"up {results['upload_bytes'] / mb:.1f} MiB, down {results['download_bytes'] / mb:.1f} MiB\n"
            f"outputs: {out}/ (results.json, metrics.jsonl, config.yaml, acc_matrix.png, accuracy_curve.png)")
