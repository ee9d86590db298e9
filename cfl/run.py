"""One run, end to end: checks, data, the round loop, and every output file."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cfl.config import Config, ConfigError, dump_yaml
from cfl.data.load import load_stream
from cfl.engine.runner import Runner
from cfl.metrics.results import build_results
from cfl.report.files import atomic_write_bytes, atomic_write_json
from cfl.report.jsonl import MetricsWriter
from cfl.report.plots import write_plots
from cfl.report.progress import ProgressBars
from cfl.report.wandb_log import WandbLogger

OUTPUT_FILES = ("results.json", "metrics.jsonl", "config.yaml", "acc_matrix.png", "accuracy_curve.png")


def default_run_dir(cfg: Config) -> Path:
    method = "+".join([cfg.method["name"], *(p["name"] for p in cfg.plugins)])
    return Path("runs") / f"{cfg.stream.name}-{method}-{cfg.partition.name}-s{cfg.seed}"


def resolve_device(cfg: Config) -> torch.device:
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"'device: {cfg.device}' but no CUDA device is available to torch; use device: cpu")
    return torch.device(cfg.device)


def prepare_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse to clobber an earlier run's outputs unless ``overwrite``."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"run directory '{out}' already holds outputs; pass --overwrite to replace them "
                              f"or --out to choose another directory")
        for name in OUTPUT_FILES:
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "wandb", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)


def execute(cfg: Config, out: Path | None = None, overwrite: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run ``cfg`` and write results.json, metrics.jsonl, config.yaml and plots into ``out``."""
    started = time.perf_counter()
    device = resolve_device(cfg)
    out = Path(out) if out is not None else default_run_dir(cfg)
    prepare_run_dir(out, overwrite)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    atomic_write_bytes(out / "config.yaml", dump_yaml(cfg).encode())
    stream = load_stream(cfg, device)
    method = "+".join([cfg.method["name"], *(p["name"] for p in cfg.plugins)])
    bars = ProgressBars(stream.num_tasks, cfg.rounds_per_task, method, enabled=not quiet)
    w = cfg.wandb
    logger = WandbLogger(w.mode, w.project, w.entity, w.group,
                         w.name or f"{cfg.stream.name}-{method}-{cfg.partition.name}-s{cfg.seed}",
                         w.tags, cfg.to_dict(), out)
    runner = Runner(cfg, stream, [bars, MetricsWriter(out / "metrics.jsonl"), logger], device)
    try:
        runner.run()
    finally:
        bars.close()
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


def summary(results: dict[str, Any], out: Path) -> str:
    mb = 1024 * 1024
    return (f"{results['method']} on {results['stream']} ({results['partition']}, seed {results['seed']}): "
            f"ACC {results['acc']:.2f}%  FGT {results['fgt']:.2f}%  BWT {results['bwt']:.2f}%  "
            f"{results['rounds']} rounds, {results['wall_seconds']:.1f}s, "
            f"up {results['upload_bytes'] / mb:.1f} MiB, down {results['download_bytes'] / mb:.1f} MiB\n"
            f"outputs: {out}/ (results.json, metrics.jsonl, config.yaml, acc_matrix.png, accuracy_curve.png)")
