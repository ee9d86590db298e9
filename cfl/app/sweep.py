"""Sweeps: a base config plus a grid of dotted keys, one run directory per combination.

A sweep file::

    base: configs/quickstart.yaml        # a path (relative to the sweep file, then the working directory) or an
                                         # inline mapping; the config's own paths: the working directory's
    out: runs/sweep                      # where the run directories go (default: runs/<sweep file stem>)
    set: {rounds_per_task: 10}           # optional overrides applied to every run
    grid:
      method.name: [fedavg, fedprox]
      seed: [0, 1, 2]
      # or keys set together, one run directory per label (docs/scaling.md, "Method-by-parameter sweeps"):
      # variant: [{label: gma, aggregator.name: gma}, {label: fot, method: {name: fot, eps: 0.96}}]

A ``variant``'s label becomes the run's config ``label``: the name of its rows in ``cfl report``, its figure
legends and its W&B group and run names (:mod:`cfl.report.labels`).

Every combination is validated before the first run starts; runs whose ``results.json`` is complete
are skipped and a run cut off with a checkpoint of the same config resumes from it (:func:`resumable`), so an
interrupted sweep, started again, resumes where it stopped. ``run_parallel`` runs them ``jobs`` at a
time in worker processes (``cfl sweep --jobs N``); each run's results are the same as one after another.
Then the comparison figures of each sweep directory's complete runs go into that directory (as
``cfl report DIR --plots DIR`` writes them).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import re
import signal
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfl.config.keys import Config, ConfigError
from cfl.config.yaml_files import read_yaml, set_dotted
from cfl.engine.rounds.stop import StopRequest
from cfl.ignored_keys import IgnoredKey
from cfl.plugin_files import PluginSource
from cfl.validation import from_dict


@dataclass(frozen=True)
class SweepRun:
    name: str
    config: Config
    out: Path
    base: Config | None = None  # the sweep's base config with its `set` keys: W&B groups name what the grid changed


def _slug(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "x"


def _variant_items(value: Any, path: Path) -> list[tuple[str, Any]]:
    """A ``variant`` grid entry: several dotted keys set together, named by its ``label``."""
    if not isinstance(value, dict) or "label" not in value:
        raise ConfigError(f"each 'variant' in '{path}' must be a mapping with a 'label' and dotted keys, got {value!r}")
    return [(k, v) for k, v in value.items() if k != "label"]


def _name_part(key: str, value: Any) -> str:
    if key == "variant":
        return _slug(value["label"])
    short = key.split(".")[-2] if key.endswith(".name") else key.split(".")[-1]
    return f"{short}={_slug(value)}"


def load_sweep(path: str | Path, out: str | Path | None = None, read_weights: bool = True) -> list[SweepRun]:
    """Every run of a sweep file, each config validated (``read_weights`` False: without opening a
    ``model.weights`` file, for plans and record checks; :func:`cfl.validation.from_dict`)."""
    path = Path(path)
    spec = read_yaml(path)
    unknown = set(spec) - {"base", "grid", "out", "set"}
    if unknown:
        raise ConfigError(f"unknown sweep key(s) {sorted(unknown)} in '{path}'; allowed: base, grid, out, set")
    base = spec.get("base", {})
    if isinstance(base, str):
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        if not base_path.is_file() and Path(base).is_file():
            base_path = Path(base)
        if not base_path.exists():
            raise ConfigError(f"sweep 'base' in '{path}': '{base}' is in neither the sweep file's folder "
                              f"('{path.parent / base}': a relative base: is resolved against it first) nor the "
                              f"working directory ('{Path.cwd() / base}'); the config's own paths (model.weights, "
                              "data_root) and out: are resolved against the working directory: fix the path, or "
                              "give an absolute one")
        base = read_yaml(base_path)
    if not isinstance(base, dict):
        raise ConfigError(f"sweep 'base' in '{path}' must be a config path or a mapping")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"sweep 'grid' in '{path}' must map dotted keys to non-empty lists of values")
    fixed = spec.get("set") or {}
    if not isinstance(fixed, dict):
        raise ConfigError(f"sweep 'set' in '{path}' must be a mapping of dotted keys to values")
    root = Path(out or spec.get("out") or Path("runs") / path.stem)
    check_out_root(root, path)
    base_cfg = _base_config(base, fixed, read_weights)
    runs = []
    keys = list(grid)
    named: dict[str, tuple[Any, ...]] = {}
    for values in itertools.product(*(grid[k] for k in keys)):
        data = json.loads(json.dumps(base))
        settings = list(fixed.items())
        for key, value in zip(keys, values, strict=True):
            settings.extend([*_variant_items(value, path), ("label", str(value["label"]))] if key == "variant"
                            else [(key, value)])
        for key, value in settings:
            set_dotted(data, key, value)
        name = "__".join(_name_part(k, v) for k, v in zip(keys, values, strict=True)) or "run"
        if name in named:
            raise _same_name(path, name, keys, named[name], values)
        named[name] = values
        try:
            cfg = from_dict(data, read_weights)
        except IgnoredKey as err:
            raise ConfigError(f"sweep combination {name}: {err}. {err.sweep_advice()}") from None
        except ConfigError as err:
            raise ConfigError(f"sweep combination {name}: {err}{_method_grid_advice(keys)}") from None
        if (root / name).exists() and not (root / name).is_dir():
            raise ConfigError(f"sweep combination {name}: its run directory {root / name} is a file; move it away "
                              "or choose another 'out'")
        runs.append(SweepRun(name, cfg, root / name, base_cfg))
    return runs


def _method_grid_advice(keys: list[str]) -> str:
    """For a grid that crosses methods with a method parameter (``method.name`` x ``method.lam``): how a
    ``variant`` entry gives each method its own parameters; else nothing."""
    methods = any(k in ("method", "method.name") for k in keys)
    params = [k for k in keys if k.startswith("method.") and k != "method.name"]
    if not (methods and params):
        return ""
    return (f". A grid crosses every key with every other, so {params[0]} reaches every method of the grid; give "
            "each method its parameters in a 'variant' entry instead, e.g. variant: [{label: FedAvg, method.name: "
            "fedavg}, {label: EWC lam=100, method: {name: ewc, lam: 100}}] (docs/scaling.md, 'Method-by-parameter "
            "sweeps')")


def _same_name(path: Path, name: str, keys: list[str], first: tuple[Any, ...], second: tuple[Any, ...]) -> ConfigError:
    """Two combinations whose grid values give one directory name (``_slug`` keeps letters, digits, '.+-')."""
    clashes = [f"{k}: {_label(a)} and {_label(b)}" for k, a, b in zip(keys, first, second, strict=True) if a != b]
    return ConfigError(f"sweep '{path}': the grid values {'; '.join(clashes)} both give the run directory name "
                       f"'{name}' (a name keeps only letters, digits, '.', '+' and '-'); make them differ there, or "
                       "give each a 'variant' entry with its own label")


def _label(value: Any) -> str:
    if isinstance(value, dict) and "label" in value:
        return f"{value['label']!r} (a variant's label)"
    return repr(value)


def check_out_root(root: Path, path: Path) -> None:
    """Refuse a sweep's ``out`` that is a file or lies under one, before any run starts."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == root else f"lies under {existing}, which is a file"
        raise ConfigError(f"sweep '{path}': its run directories' folder {root} {where}, not a directory; choose "
                          "another 'out' (or --out)")


def _base_config(base: dict[str, Any], fixed: dict[str, Any], read_weights: bool = True) -> Config | None:
    """The base config with the sweep's `set` keys, or None where only the grid makes it valid (W&B groups
    then name no keys, only the config hash)."""
    data = json.loads(json.dumps(base))
    for key, value in fixed.items():
        set_dotted(data, key, value)
    try:
        return from_dict(data, read_weights)
    except ConfigError:
        return None


def load_sweeps(paths: list[str | Path], out: str | Path | None = None) -> list[SweepRun]:
    """The runs of several sweep files, in order; ``out`` may only replace the directory of a single sweep."""
    if out is not None and len(paths) > 1:
        raise ConfigError(f"--out names the directory of one sweep; {len(paths)} sweep files were given "
                          "(set 'out' in each sweep file instead)")
    runs: list[SweepRun] = []
    seen: dict[Path, Path] = {}
    for path in paths:
        for run in load_sweep(path, out):
            if run.out in seen:  # one sweep's own names never clash (load_sweep refuses that)
                raise ConfigError(f"the sweep files '{seen[run.out]}' and '{path}' both write into the same directory "
                                  f"'{run.out}'; give the sweep files different 'out' directories")
            seen[run.out] = Path(path)
            runs.append(run)
    return runs


def is_complete(run_dir: Path) -> bool:
    results = run_dir / "results.json"
    if not results.is_file():
        return False
    try:
        return bool(json.loads(results.read_text()).get("complete"))
    except (OSError, json.JSONDecodeError):
        return False


def resumable(config: Config, out: Path) -> tuple[bool, str]:
    """Whether the run in ``out`` continues from its checkpoint: there is one and the run's ``config.yaml``
    (the config it was started with, up to result-neutral keys) is ``config``; and what to say about it."""
    from cfl.engine.stores.checkpoint import config_changes
    from cfl.records.run_dir import CHECKPOINT

    if not (out / CHECKPOINT).is_file():
        return False, ""
    try:
        diffs = config_changes(read_yaml(out / "config.yaml"), config)
    except (ConfigError, OSError) as err:
        return False, f"its {CHECKPOINT} has no readable config.yaml beside it ({err}); starting it again from round 0"
    if diffs:
        return False, f"its {CHECKPOINT} is of another config ({diffs}); starting it again from round 0"
    return True, f"resuming from its {CHECKPOINT}"


def pending_runs(runs: list[SweepRun]) -> list[tuple[int, SweepRun]]:
    """The incomplete runs with their 1-based positions; complete ones are announced as skipped, cut-off ones
    as resumed (or started again, saying why)."""
    pending = []
    for i, run in enumerate(runs, 1):
        if is_complete(run.out):
            print(f"[{i}/{len(runs)}] {run.name}: already complete, skipped", flush=True)
            continue
        note = resumable(run.config, run.out)[1]
        if note:
            print(f"[{i}/{len(runs)}] {run.name}: {note}", flush=True)
        pending.append((i, run))
    return pending


def write_sweep_figures(runs: list[SweepRun]) -> list[Path]:
    """The comparison figures (:mod:`cfl.report.compare_plots`) of each sweep directory's complete runs,
    written into that directory; returns the files written."""
    from cfl.report.compare_plots import write_figures

    files: list[Path] = []
    for root in sorted({run.out.parent for run in runs}):
        done = [run.out for run in runs if run.out.parent == root and is_complete(run.out)]
        if done:
            files += write_figures(done, root)
    return files


def run_local(runs: list[SweepRun], quiet: bool = True) -> tuple[list[dict[str, Any]], list[str]]:
    """Run every incomplete combination one after another in this process; returns (results, failed names).

    A run that fails is reported by name and the next one starts; a signal (Ctrl-C, SIGTERM) stops the sweep.
    """
    from cfl.engine.rounds.stop import RunStopped

    finished: list[dict[str, Any]] = []
    failed: list[str] = []
    pending = pending_runs(runs)
    for n, (i, run) in enumerate(pending):
        stop = StopRequest()
        _record(run_job(run.config, run.out, quiet, run.base, stop=stop), i, len(runs), run.name, finished, failed)
        if stop():  # a signal in the run's last round or while it wrote its outputs: the run is complete, stop here
            left = len(pending) - n - 1
            raise RunStopped(f"stopped by {stop.name} after run {run.name} finished (its outputs are complete); "
                             f"{left} run(s) not started", 128 + int(stop.signum or 0))
    return finished, failed


def run_job(config: Config, out: Path, quiet: bool = True, base: Config | None = None,
            plugins: tuple[PluginSource, ...] = (), stop: StopRequest | None = None) -> dict[str, Any] | str:
    """One sweep run, resumed from its checkpoint where :func:`resumable`: its results, or why it failed (a
    plain string, so it crosses process boundaries). ``plugins``: the sweep's ``--plugin`` files, imported first
    (in a worker process; once per process). ``stop``: the run's signal flag (:func:`cfl.app.single_run.execute`)."""
    from cfl.app.single_run import execute
    from cfl.engine.rounds.stop import RunStopped
    from cfl.plugin_files import load_sources
    from cfl.report.wandb_sweep import RunSource

    try:
        load_sources(list(plugins))
        resume = resumable(config, out)[0]
        return execute(config, out, overwrite=not resume, quiet=quiet, resume=resume, source=RunSource(base),
                       stop=stop)
    except RunStopped as err:
        if err.exit_code >= 128:  # stopped by a signal: the sweep stops too
            raise
        return f"{err} (exit code {err.exit_code})"
    except Exception as err:  # noqa: BLE001 - one failed run must not stop the sweep
        return f"{type(err).__name__}: {err}"


def _record(outcome: dict[str, Any] | str, i: int, total: int, name: str, finished: list[dict[str, Any]],
            failed: list[str]) -> None:
    if isinstance(outcome, str):
        failed.append(name)
        print(f"[{i}/{total}] {name}: FAILED: {outcome}", flush=True)
    else:
        finished.append(outcome)
        print(_report_line(i, total, name, outcome), flush=True)


def _report_line(i: int, total: int, name: str, results: dict[str, Any]) -> str:
    return (f"[{i}/{total}] {name}: ACC {results['acc']:.2f}  FGT {results['fgt']:.2f}  "
            f"({results['wall_seconds']:.0f}s)")


def run_parallel(runs: list[SweepRun], jobs: int,
                 plugins: list[PluginSource] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Run every incomplete combination, ``jobs`` at a time, each in a fresh (spawned) worker process.

    A run that fails is reported by name and does not stop the others; returns (results, failed names).
    Runs with ``threads: 0`` get ``cpu_count // jobs`` threads each so the workers do not oversubscribe.
    A run is handed to a worker only when one is free, so after a signal no further run starts; the workers
    die with this process (:mod:`cfl.app.sweep_workers`).
    """
    from concurrent.futures import FIRST_COMPLETED, wait

    from cfl.app.sweep_workers import SweepStop, init_worker, run_in_worker
    from cfl.engine.rounds.stop import RunStopped

    pending = pending_runs(runs)
    finished: list[dict[str, Any]] = []
    failed: list[str] = []
    if not pending:
        return finished, failed
    threads = max(1, (os.cpu_count() or 1) // jobs)
    context = multiprocessing.get_context("spawn")  # no forked torch thread pools
    shipped = tuple(plugins or ())
    waiting, running = list(pending), {}
    with ProcessPoolExecutor(min(jobs, len(pending)), mp_context=context, initializer=init_worker,
                             initargs=(threads, os.getpid())) as pool:
        stop = SweepStop(lambda: list(getattr(pool, "_processes", None) or {}))
        previous = stop.install()
        try:
            while waiting or running:
                while waiting and len(running) < jobs and stop.signum is None:
                    i, run = waiting.pop(0)
                    job = pool.submit(run_in_worker, run_job, run.config, run.out, True, run.base, shipped)
                    running[job] = (i, run)
                if not running:
                    break
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    i, run = running.pop(future)
                    try:
                        outcome = future.result()
                    except RunStopped as err:
                        if err.exit_code < 128:
                            raise
                        print(f"[{i}/{len(runs)}] {run.name}: {err}", flush=True)
                        continue
                    except Exception as err:  # noqa: BLE001 - a worker that died: this run failed, the others go on
                        outcome = f"{type(err).__name__}: {err}"
                    _record(outcome, i, len(runs), run.name, finished, failed)
        finally:
            stop.restore(previous)
    if stop.signum is not None:
        raise RunStopped(f"stopped by {signal.Signals(stop.signum).name}; {len(waiting)} run(s) not started",
                         128 + stop.signum)
    return finished, failed
